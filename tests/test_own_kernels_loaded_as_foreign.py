"""Our own kernels through the path third parties' kernels take (docs/THIRD_PARTY.md, "Our own kernels
through the same path").

The adapters of vllm-triton, flaggems and liger load a project's kernel source with
``running/foreign_kernels.py`` (``load_jit_functions``: ``ast``, decorators checked and dropped, the
definitions compiled alone with the real ``triton`` and ``tl``, built for our backend) and run it under
``corrected_interpreter`` (the interpreter's fp8/bf16 conversions and bf16 arithmetic made a GPU's).
Here the same loader reads ``mla_fuse/kernels/*.py``: the ``@jit`` helpers of ``conversions.py``,
``indexing.py`` and ``rotation.py``, each file given exactly the helpers it imports, then the kernel of
each operation; the module's ``launcher`` is replaced by one launching the loaded kernel and
the public op (``mla_fuse.ops``, validation included) runs under the corrections. Fixed cases of all five
operations (fp32/bf16/fp16 inputs; auto, float32, fp8 E4M3/E5M2 caches as uint8 and float8; fp8 values
that round, saturate, are NaN or subnormal) must (1) pass against the reference as our tests judge them
(rotated values within CONTRACT §5's bound, cache bytes bit for bit) and (2) equal our normal path bit
for bit: the loading path makes no false failure. Our kernels round by integer arithmetic, so the
corrections are exercised by the same kernels written with Triton's own casts (as third parties write
them): wrong without the corrections, our bits with them. Planted bugs in the loaded source (a flipped
sign in the rotation, a multiplication by the fp8 scale) must fail the same check: no false pass.
18 tests, about 3 s under the interpreter on a 2-core machine.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import triton
import triton.language as tl

from mla_fuse import ops
from mla_fuse.kernels import INTERPRETED, flash_cache, flash_rope_cache, mla_cache, mla_rope_cache
from mla_fuse.kernels import rotary_embedding as rope_kernel
from mla_fuse_conformance.judging import comparisons
from mla_fuse_conformance.running.foreign_kernels import load_jit_functions
from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter
from mla_fuse_reference import ops as ref
from mla_fuse_reference import rope as ref_rope

DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
KERNELS = pathlib.Path(rope_kernel.__file__).parent
# the files of the @jit helpers, each after the ones it imports from
HELPER_FILES = ("conversions.py", "indexing.py", "rotation.py")
# operation -> (launcher module, kernel name; the file is the module's)
KERNEL_OF = {"rotary_embedding": (rope_kernel, "rotary_embedding_kernel"),
             "concat_and_cache_mla": (mla_cache, "mla_cache_kernel"),
             "concat_and_cache_mla_rope_fused": (mla_rope_cache, "mla_rope_cache_kernel"),
             "reshape_and_cache_flash": (flash_cache, "flash_cache_kernel"),
             "rope_and_reshape_and_cache_flash": (flash_rope_cache, "flash_rope_cache_kernel")}
KERNEL_DECORATOR = ["jit(do_not_specialize=EVERY_ARGUMENT, do_not_specialize_on_alignment=EVERY_ARGUMENT)"]
# fp8 inputs that round to even, saturate (E4M3), are NaN, -0 or subnormal
SPECIAL = [1.0625, 464.0, 500.0, -1000.0, float("nan"), 3 * 2.0 ** -10, -0.0, 2.0 ** -9, 70000.0, 0.3]


def _imports(path: pathlib.Path, loaded: dict) -> dict:
    """The loaded helpers ``path`` imports (``from mla_fuse.kernels.X import a, b``)."""
    tree = ast.parse(path.read_text())
    names = [alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
             and (node.module or "").startswith("mla_fuse.kernels.") for alias in node.names]
    return {name: loaded[name] for name in names if name in loaded}


def _jit_definitions(path: pathlib.Path) -> list[str]:
    """The module-level functions of ``path`` with a decorator naming ``jit`` (``load_jit_functions``
    then checks it is exactly ``@jit``)."""
    return [node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)
            and any("jit" in ast.unparse(decorator) for decorator in node.decorator_list)]


def load_own_kernels(sources: dict[str, str] | None = None) -> dict:
    """Operation -> its kernel loaded by ``load_jit_functions`` from our file (helpers first), and
    ``"helpers"`` -> the loaded helpers. ``sources``: file name -> planted text."""
    sources = sources or {}
    base = {"triton": triton, "tl": tl}
    helpers: dict = {}
    for file in HELPER_FILES:
        path = KERNELS / file
        helpers.update(load_jit_functions(path, {name: ["jit"] for name in _jit_definitions(path)},
                                          {**base, **_imports(path, helpers)}, INTERPRETED, sources.get(file)))
    kernels = {"helpers": helpers}
    for operation, (module, name) in KERNEL_OF.items():
        path = pathlib.Path(module.__file__)
        kernels[operation] = load_jit_functions(path, {name: KERNEL_DECORATOR}, {**base, **_imports(path, helpers)},
                                                INTERPRETED, sources.get(path.name))[name]
    return kernels


# ---------------------------------------------------------------- fixed cases


def _randn(*shape, dtype, seed):
    values = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 4.0
    return values.to(dtype).to(DEVICE)


def _with_special(x):
    """``x`` with its first row's first elements set to SPECIAL (in x's dtype)."""
    x = x.clone()
    count = min(len(SPECIAL), x.shape[-1])
    x.view(-1, x.shape[-1])[0, :count] = torch.tensor(SPECIAL[:count]).to(x.dtype)
    return x


def _table(rotary_dim, dtype=torch.float32, rows=16):
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype).to(DEVICE)


def _cache(shape, cache_dtype):
    if cache_dtype.itemsize == 1:  # fp8 codes: a sentinel byte where nothing is written
        return torch.full(shape, 0x5A, dtype=torch.uint8, device=DEVICE).view(cache_dtype)
    return torch.full(shape, 7.0, dtype=cache_dtype, device=DEVICE)


POSITIONS = [0, 15, 7, 7, 12]
SLOTS = [3, -1, 0, 9]  # padding, and shorter than the 5 tokens


def _tensor(values):
    return torch.tensor(values, device=DEVICE)


def rope_case(dtype, heads, kv_heads, head_size, rotary_dim, is_neox, rank, table_dtype):
    query = _randn(5, heads, head_size, dtype=dtype, seed=1)
    key = None if kv_heads == 0 else _randn(5, kv_heads, head_size, dtype=dtype, seed=2)
    if rank == 2:
        query, key = query.reshape(5, -1), None if key is None else key.reshape(5, -1)
    return [_tensor(POSITIONS), query, key, head_size, _table(rotary_dim, table_dtype), is_neox]


def mla_case(kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim, scale):
    return [_with_special(_randn(5, latent, dtype=dtype, seed=3)), _randn(5, rotary_dim, dtype=dtype, seed=4),
            _cache((3, 4, latent + rotary_dim), cache_dtype), _tensor(SLOTS), kv_cache_dtype, _tensor([scale])]


def mla_fused_case(kv_cache_dtype, dtype, cache_dtype, heads, latent, rotary_dim, is_neox, table_dtype, scale):
    return [_tensor(POSITIONS), _randn(5, heads, rotary_dim, dtype=dtype, seed=5),
            _randn(5, rotary_dim, dtype=dtype, seed=6), _with_special(_randn(5, latent, dtype=dtype, seed=7)),
            _table(rotary_dim, table_dtype), is_neox, _tensor(SLOTS), _cache((3, 4, latent + rotary_dim), cache_dtype),
            kv_cache_dtype, _tensor([scale])]


def flash_case(kv_cache_dtype, dtype, cache_dtype, kv_heads, head_size, value_head_size, scales):
    key, value = _randn(5, kv_heads, head_size, dtype=dtype, seed=8), _randn(5, kv_heads, value_head_size,
                                                                             dtype=dtype, seed=9)
    return [key, _with_special(value), _cache((4, 4, kv_heads, head_size), cache_dtype),
            _cache((4, 4, kv_heads, value_head_size), cache_dtype), _tensor(SLOTS), kv_cache_dtype,
            _tensor(scales[0]), _tensor(scales[1])]


def flash_fused_case(kv_cache_dtype, dtype, cache_dtype, heads, kv_heads, head_size, value_head_size, rotary_dim,
                     is_neox, scales):
    query, key = _randn(5, heads, head_size, dtype=dtype, seed=10), _randn(5, kv_heads, head_size, dtype=dtype,
                                                                           seed=11)
    value = _with_special(_randn(5, kv_heads, value_head_size, dtype=dtype, seed=12))
    return [_tensor(POSITIONS), query, key, value, _cache((4, 4, kv_heads, head_size), cache_dtype),
            _cache((4, 4, kv_heads, value_head_size), cache_dtype), _tensor(SLOTS), _table(rotary_dim), is_neox,
            kv_cache_dtype, _tensor(scales[0]), _tensor(scales[1])]


CASES = {
    "rope-bf16-neox-gqa-bf16-table": ("rotary_embedding", rope_case(torch.bfloat16, 4, 2, 64, 64, True, 3,
                                                                    torch.bfloat16)),
    "rope-fp16-gptj-partial-rank2": ("rotary_embedding", rope_case(torch.float16, 2, 1, 128, 64, False, 2,
                                                                   torch.float32)),
    "rope-fp32-no-key-R48": ("rotary_embedding", rope_case(torch.float32, 3, 0, 80, 48, True, 3, torch.float32)),
    "mla-auto-bf16": ("concat_and_cache_mla", mla_case("auto", torch.bfloat16, torch.bfloat16, 32, 16, 1.0)),
    "mla-float32": ("concat_and_cache_mla", mla_case("float32", torch.float32, torch.float32, 12, 6, 1.0)),
    "mla-fp8e4m3-bf16-float8-cache": ("concat_and_cache_mla", mla_case("fp8_e4m3", torch.bfloat16,
                                                                       torch.float8_e4m3fn, 16, 8, 0.75)),
    "mla-fp8e5m2-fp32-uint8-cache": ("concat_and_cache_mla", mla_case("fp8_e5m2", torch.float32, torch.uint8, 16,
                                                                      4, 2.0)),
    "mla-fused-fp8-bf16-gptj": ("concat_and_cache_mla_rope_fused", mla_fused_case(
        "fp8", torch.bfloat16, torch.uint8, 2, 16, 16, False, torch.float32, 0.75)),
    "mla-fused-auto-fp16-neox-fp16-table": ("concat_and_cache_mla_rope_fused", mla_fused_case(
        "auto", torch.float16, torch.float16, 3, 32, 8, True, torch.float16, 1.0)),
    "flash-auto-fp16-D40": ("reshape_and_cache_flash", flash_case("auto", torch.float16, torch.float16, 2, 40, 40,
                                                                  ([1.0], [1.0]))),
    "flash-fp8e5m2-bf16-per-head-scales": ("reshape_and_cache_flash", flash_case(
        "fp8_e5m2", torch.bfloat16, torch.float8_e5m2, 2, 32, 16, ([0.5, 3.0], [2.0, 0.25]))),
    "flash-fused-fp8e4m3-bf16-gptj-tail": ("rope_and_reshape_and_cache_flash", flash_fused_case(
        "fp8_e4m3", torch.bfloat16, torch.uint8, 4, 2, 64, 32, 32, False, ([0.75], [1.5]))),
    "flash-fused-float32-neox": ("rope_and_reshape_and_cache_flash", flash_fused_case(
        "float32", torch.float32, torch.float32, 2, 1, 32, 24, 32, True, ([1.0], [1.0]))),
}


# ---------------------------------------------------------------- running and judging


def _bits(tensor):
    return tensor.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def run(operation, arguments, kernel=None, monkeypatch=None, corrected=True):
    """The arguments after ``mla_fuse.ops.<operation>`` ran on copies of them: with our kernel, or with
    ``kernel`` in its place (the module's ``launcher`` replaced by Triton's ``kernel[grid](...)``) under
    ``corrected_interpreter`` (without it: ``corrected=False``)."""
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in arguments]
    if kernel is None:
        getattr(ops, operation)(*copies)
        return copies
    module, _ = KERNEL_OF[operation]

    def launcher(plan, *tensors):  # as mla_fuse.kernels.launcher.Launcher is called
        kernel[plan.grid](*plan.arguments(tensors), ALIGNED=plan.aligned, **plan.constexprs)

    with monkeypatch.context() as patch:
        patch.setattr(module, "launcher", launcher)
        with corrected_interpreter() if corrected else uncorrected_interpreter():
            getattr(ops, operation)(*copies)
    return copies


def assert_rotated(what, got, before, positions, table, is_neox, head_size):
    """CONTRACT §5 (``single``): the first R elements of each head within the bound of the exact
    rotation, the rest bit for bit."""
    got, before = (x.reshape(x.size(0), -1, head_size).cpu() for x in (got, before))
    positions, table = positions.cpu(), table.cpu()
    rotary_dim = table.size(1)
    exact = ref_rope.rope_exact(positions, before, table, is_neox)[..., :rotary_dim]
    bound = comparisons.rope_bound(exact, comparisons.rotation_terms(positions, before, table, is_neox), got.dtype,
                                   "single")
    bad = ~((got[..., :rotary_dim].double() - exact).abs() <= bound)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.numel()} rotated values past the bound"
    assert torch.equal(_bits(got[..., rotary_dim:]), _bits(before[..., rotary_dim:])), f"{what}: the tail changed"


def assert_same_bits(what, got, want):
    differ = int((_bits(got) != _bits(want)).sum())
    assert differ == 0, f"{what}: {differ} of {got.numel()} elements differ from the reference"


def check(operation, before, after):
    """The verdict on one run against the reference (AssertionError naming what failed)."""
    if operation == "rotary_embedding":
        positions, query, key, head_size, table, is_neox = before
        assert_rotated("query", after[1], query, positions, table, is_neox, head_size)
        if key is not None:
            assert_rotated("key", after[2], key, positions, table, is_neox, head_size)
    elif operation == "concat_and_cache_mla":
        assert_same_bits("kv_cache", after[2], ref.concat_and_cache_mla(*before))
    elif operation == "concat_and_cache_mla_rope_fused":
        positions, q_pe, k_pe, kv_c, table, is_neox, slots, cache, kv_cache_dtype, scale = before
        assert_rotated("q_pe", after[1], q_pe, positions, table, is_neox, q_pe.size(-1))
        assert_rotated("k_pe", after[2], k_pe[:, None], positions, table, is_neox, k_pe.size(-1))
        # the cache holds what the reference writes from the rotated values written back (CONTRACT §2)
        assert_same_bits("kv_cache", after[7], ref.concat_and_cache_mla(kv_c, after[2], cache, slots,
                                                                         kv_cache_dtype, scale))
    elif operation == "reshape_and_cache_flash":
        for what, got, want in zip(("key_cache", "value_cache"), after[2:4], ref.reshape_and_cache_flash(*before)):
            assert_same_bits(what, got, want)
    else:
        positions, query, key, value, key_cache, value_cache, slots, table, is_neox, dtype, k_scale, v_scale = before
        assert_rotated("query", after[1], query, positions, table, is_neox, query.size(-1))
        assert_rotated("key", after[2], key, positions, table, is_neox, key.size(-1))
        want = ref.reshape_and_cache_flash(after[2], value, key_cache, value_cache, slots, dtype, k_scale, v_scale)
        for what, got, expected in zip(("key_cache", "value_cache"), after[4:6], want):
            assert_same_bits(what, got, expected)


@pytest.fixture(scope="module")
def own_kernels():
    return load_own_kernels()


@pytest.mark.parametrize("case", list(CASES))
def test_our_kernels_loaded_as_foreign_pass_and_equal_our_path(case, own_kernels, monkeypatch):
    operation, arguments = CASES[case]
    loaded = run(operation, arguments, own_kernels[operation], monkeypatch)
    check(operation, arguments, loaded)  # the verdict through the foreign path: no false failure
    ours = run(operation, arguments)
    for i, (got, want) in enumerate(zip(loaded, ours)):
        if isinstance(got, torch.Tensor):
            assert torch.equal(_bits(got), _bits(want)), f"argument {i}: the loaded kernel differs from ours"


def test_what_runs_is_built_by_the_loader():
    """The loaded kernels are the loader's (not our ``jit``'s ``InterpretedHelper``), and a helper calling
    another of its file calls the built one (``load_jit_functions`` puts the built functions in the globals)."""
    kernels = load_own_kernels()
    helpers = kernels["helpers"]
    kind = triton.runtime.jit.JITFunction
    if INTERPRETED:
        from triton.runtime.interpreter import InterpretedFunction as kind
    for operation, (module, name) in KERNEL_OF.items():
        assert type(kernels[operation]) is kind and kernels[operation] is not getattr(module, name), operation
    assert helpers["quantize"].fn.__globals__["widen_to_float32"] is helpers["widen_to_float32"]
    assert helpers["rotate_in_place"].fn.__globals__["pair_pointers"] is helpers["pair_pointers"]
    assert kernels["rotary_embedding"].fn.__globals__["rotate_in_place"] is helpers["rotate_in_place"]
    assert "quantize" not in kernels["rotary_embedding"].fn.__globals__  # only what the file imports
    assert len(helpers) == 12, sorted(helpers)  # every @jit helper of the three files


# our two down-casts as a third party writes them: Triton's own conversions (on a GPU: round to nearest
# even, fp8 saturating at the finite max), where ours are integer arithmetic on the fp32 bits
TRITON_CASTS = {
    "round_float32": "    return x.to(DTYPE)\n",
    "quantize": ("    FP8: tl.constexpr = tl.float8e4nv if FP8_FORMAT == 1 else tl.float8e5\n"
                 "    return tl.math.div_rn(widen_to_float32(x), scale).to(FP8).to(tl.uint8, bitcast=True)\n"),
}


def _with_triton_casts() -> dict[str, str]:
    """``conversions.py`` with the bodies (after the docstring) of TRITON_CASTS' helpers replaced."""
    source = (KERNELS / "conversions.py").read_text()
    lines = source.splitlines(keepends=True)
    definitions = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    for name in sorted(TRITON_CASTS, key=lambda name: -definitions[name].lineno):  # from the end: lines stay put
        body = definitions[name].body
        lines[body[1].lineno - 1:body[-1].end_lineno] = [TRITON_CASTS[name]]
    return {"conversions.py": "".join(lines)}


# the cases with a down-cast that the interpreter gets wrong: bf16 rotation results, fp8 codes
ROUNDED_TO_BF16 = {"rope-bf16-neox-gqa-bf16-table"}
QUANTIZED = {"mla-fp8e4m3-bf16-float8-cache", "mla-fp8e5m2-fp32-uint8-cache", "mla-fused-fp8-bf16-gptj",
             "flash-fp8e5m2-bf16-per-head-scales", "flash-fused-fp8e4m3-bf16-gptj-tail"}


def _same_bits(run_a, run_b):
    return all(torch.equal(_bits(a), _bits(b)) for a, b in zip(run_a, run_b) if isinstance(a, torch.Tensor))


@pytest.mark.skipif(not INTERPRETED, reason="the corrections apply under Triton's interpreter only")
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # uncorrected NaN -> fp8
def test_our_kernels_with_triton_casts_need_the_corrections_and_pass_with_them(monkeypatch):
    """Our kernels never use Triton's float down-casts, so the corrections have next to nothing to act on
    above (one scalar fp32 -> bf16 conversion in all the cases). Written with Triton's casts instead, as
    third parties write them, the same kernels meet the interpreter's errors: without the corrections the
    bf16 rotation (truncated: still inside the bound) and the fp8 cases differ from our path, and the fp8
    cases fail the verdict (false failures); with them every case passes and equals our path bit for bit."""
    kernels = load_own_kernels(_with_triton_casts())
    differ, fail = set(), set()
    for case, (operation, arguments) in CASES.items():
        ours = run(operation, arguments)
        corrected = run(operation, arguments, kernels[operation], monkeypatch)
        check(operation, arguments, corrected)
        assert _same_bits(corrected, ours), f"{case}: Triton's casts, corrected, differ from our kernels"
        uncorrected = run(operation, arguments, kernels[operation], monkeypatch, corrected=False)
        if not _same_bits(uncorrected, ours):
            differ.add(case)
        try:
            check(operation, arguments, uncorrected)
        except AssertionError:
            fail.add(case)
    assert differ == ROUNDED_TO_BF16 | QUANTIZED and fail == QUANTIZED, (sorted(differ), sorted(fail))


def _planted(file, old, new, sources=None):
    source = (sources or {}).get(file) or (KERNELS / file).read_text()
    assert source.count(old) == 1, f"{file} no longer has {old!r}: update the planted bug"
    return {**(sources or {}), file: source.replace(old, new)}


@pytest.mark.parametrize("plant, cases, message", [
    (lambda: _planted("rotation.py", "a * cos - b * sin", "a * cos + b * sin"),
     ["rope-fp32-no-key-R48", "mla-fused-fp8-bf16-gptj", "flash-fused-float32-neox"], "past the bound"),
    (lambda: _planted("conversions.py", "quotient = tl.math.div_rn(wide, scale)", "quotient = wide * scale"),
     ["mla-fp8e4m3-bf16-float8-cache", "flash-fp8e5m2-bf16-per-head-scales"], "differ from the reference"),
    (lambda: _planted("conversions.py", "tl.math.div_rn(widen_to_float32(x), scale)", "(widen_to_float32(x) * scale)",
                      _with_triton_casts()),
     ["mla-fp8e4m3-bf16-float8-cache", "flash-fused-fp8e4m3-bf16-gptj-tail"], "differ from the reference"),
], ids=["rotation-sign-flipped", "fp8-multiplied-by-scale", "fp8-multiplied-by-scale-triton-casts"])
def test_a_planted_bug_in_the_loaded_source_fails_the_check(plant, cases, message, monkeypatch):
    """No false pass: our source with a flipped sign in the rotation, or multiplying by the fp8 scale (our
    quantization, or Triton's fp8 cast as above, where the corrections act), loaded the same way and run
    under the corrections, fails the verdict the unplanted source passes."""
    kernels = load_own_kernels(plant())
    for case in cases:
        operation, arguments = CASES[case]
        with pytest.raises(AssertionError, match=message):
            check(operation, arguments, run(operation, arguments, kernels[operation], monkeypatch))
