"""flash-attn's Triton rotary through ``--impl flash-attn-rotary`` (``property_tests/adapters/flash_attn_rotary.py``;
docs/THIRD_PARTY.md is the report).

Loading (nothing of flash-attn imported, ``sys.modules`` and ``os.environ`` unchanged); the mapping of a
contract case onto flash-attn's decode-step form, on hand-computed values for each pairing; fixed cases
against CONTRACT §5's bound; planted kernel bugs the same checks catch; the declared limit refused; and,
under Triton's interpreter, the bfloat16 correction of ``corrected_interpreter``
(``running/interpreter_corrections.py``) shown needed and hiding no truncating kernel; the confirmed defect by
its second routes. About 30 s under the interpreter.

Where flash-attn comes from: ``$MLA_FUSE_FLASH_ATTN_PATH`` (a directory holding ``flash_attn/``: the unpacked
sdist's ``flash_attn-2.8.3.post2/``), else the installed package, else ``$MLA_FUSE_FLASH_ATTN_SDIST`` (the
sdist ``.tar.gz``, unpacked here into a temporary directory); otherwise skipped, and under CI=true failed
(.ci/run downloads the sdist).
"""

from __future__ import annotations

import os
import pathlib
import sys
import tarfile

import pytest
import torch

from mla_fuse.kernels import INTERPRETED
from mla_fuse_conformance.judging.comparisons import rope_bound, rotation_terms
from mla_fuse_reference.rope import rope_exact
from third_party_helpers import DEVICE, adapter_loader, bf16_tie_case, randn, rope_table

PATH_ENV_VAR, SDIST_ENV_VAR = "MLA_FUSE_FLASH_ATTN_PATH", "MLA_FUSE_FLASH_ATTN_SDIST"
INTERPRETER_ONLY = pytest.mark.skipif(not INTERPRETED, reason="the bf16 corrections apply under the interpreter only")


@pytest.fixture(scope="module")
def flash_attn_root(tmp_path_factory):
    """The directory ``${PATH_ENV_VAR}`` is to name (None: the installed package)."""
    import importlib.util

    if os.environ.get(PATH_ENV_VAR):
        return os.environ[PATH_ENV_VAR]
    if importlib.util.find_spec("flash_attn") is not None:
        return None
    sdist = os.environ.get(SDIST_ENV_VAR)
    if not sdist:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"flash-attn not found: .ci/run downloads the sdist and sets {SDIST_ENV_VAR}")
        pytest.skip(f"flash-attn not found: set {PATH_ENV_VAR} to the unpacked flash-attn 2.8.3.post2 sdist, or "
                    f"{SDIST_ENV_VAR} to the sdist (.tar.gz), or install it")
    root = tmp_path_factory.mktemp("flash_attn")
    with tarfile.open(sdist) as archive:
        archive.extractall(root, filter="data")
    (top,) = root.iterdir()  # flash_attn-2.8.3.post2/
    return str(top)


@pytest.fixture
def flash_attn(flash_attn_root, monkeypatch):
    """A loader of the adapter: ``flash_attn(source=None, **attributes)``."""
    from mla_fuse_conformance.adapters.flash_attn_rotary import FlashAttnRotaryImplementation

    return adapter_loader(FlashAttnRotaryImplementation, flash_attn_root, PATH_ENV_VAR, monkeypatch)






def _outside_bound(got, before, positions, table, head_size, is_neox):
    """How many rotated elements of ``got`` lie outside CONTRACT §5's ``single`` bound (the declaration)."""
    got, before = got.reshape(got.size(0), -1, head_size), before.reshape(before.size(0), -1, head_size)
    rotary_dim = table.size(1)
    exact = rope_exact(positions, before, table, is_neox)[..., :rotary_dim]
    bound = rope_bound(exact, rotation_terms(positions, before[..., :rotary_dim], table, is_neox), got.dtype,
                       "single")
    return int(((got[..., :rotary_dim].double() - exact).abs() > bound).sum())


def test_loading_imports_nothing_of_flash_attn_and_changes_no_setting(flash_attn, flash_attn_root):
    from mla_fuse_conformance.adapters.flash_attn_rotary import package_dir

    def load_and_call():
        impl = flash_attn()
        query = randn(2, 1, 8, dtype=torch.float32, seed=0)
        impl.rotary_embedding(torch.tensor([1, 0], device=DEVICE), query, query.clone(), 8, rope_table(8, torch.float32),
                              True)
        return impl

    environ = dict(os.environ)
    load_and_call()  # the first call imports what torch and triton import lazily (wrap_triton, the interpreter)
    modules = set(sys.modules)
    impl = load_and_call()
    assert set(sys.modules) == modules and dict(os.environ) == environ
    package = str(package_dir())
    assert not [name for name in sys.modules if name.split(".")[0] in ("flash_attn", "flash_attn_2_cuda", "rotary_emb")]
    assert not [name for name, module in list(sys.modules.items())
                if str(getattr(module, "__file__", None) or "").startswith(package)]
    assert flash_attn_root is None or impl.version == "flash_attn 2.8.3.post2", impl.version
    assert impl.kernel_file == os.path.join(package, "ops", "triton", "rotary.py")


# Row 0: cos 1, sin 0; row 1: cos (0.5, 0.25), sin (0.75, -1): every product and sum exact in fp32.
HAND_TABLE = [[1.0, 1.0, 0.0, 0.0], [0.5, 0.25, 0.75, -1.0]]
# x = (1, 2, 3, 4) at position 1; NeoX pairs (x0, x2), (x1, x3); GPT-J (x0, x1), (x2, x3); a' = ac - bs, b' = bc + as
HAND_ROTATED = {True: [-1.75, 4.5, 2.25, -1.0], False: [-1.0, 1.75, 4.75, -2.0]}


@pytest.mark.parametrize("is_neox", [True, False])
def test_the_mapping_onto_the_decode_steps_form_on_a_hand_computed_case(flash_attn, is_neox):
    from mla_fuse_conformance.adapters.flash_attn_rotary import engine_form

    parent = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]] * 2] * 2, device=DEVICE)  # [T=2, H=2, 7]
    query = parent[..., :6]  # D = 6, R = 4: the tail (5, 6) passes through; the 7th column is outside the view
    offsets, x = engine_form(torch.tensor([[1], [0]], device=DEVICE), query, 2, 6)
    assert offsets.tolist() == [1, 0] and x.shape == (2, 1, 2, 6)
    assert x.data_ptr() == query.data_ptr() and (x.stride(0), x.stride(2), x.stride(3)) == query.stride()
    flash_attn().rotary_embedding(torch.tensor([1, 0], device=DEVICE), query, None, 6,
                                  torch.tensor(HAND_TABLE, device=DEVICE), is_neox)
    assert parent[0, :, :4].tolist() == [HAND_ROTATED[is_neox]] * 2, "token 0 at position 1"
    assert parent[1, :, :4].tolist() == [[1.0, 2.0, 3.0, 4.0]] * 2, "token 1 at position 0: cos 1, sin 0"
    assert parent[..., 4:].tolist() == [[[5.0, 6.0, 7.0]] * 2] * 2, "the tail and the parent outside the view"


@pytest.mark.parametrize("dtype, table_dtype, heads, kv_heads, head_size, rotary_dim, rank, strided, is_neox, key", [
    (torch.bfloat16, torch.float32, 4, 2, 64, 64, 3, False, True, True),  # fp32 table, one rounding on store
    (torch.bfloat16, torch.bfloat16, 4, 2, 64, 64, 3, False, False, True),  # the model's dtype, as flash-attn builds it
    (torch.float16, torch.float16, 3, 1, 128, 48, 3, True, True, True),  # partial rotary, a strided query
    (torch.float32, torch.float32, 2, 2, 80, 80, 2, False, False, True),  # [T, H * D]
    (torch.bfloat16, torch.bfloat16, 2, 1, 256, 64, 2, True, True, False),  # the largest head, key None
])
def test_fixed_cases_within_the_contracts_bound(flash_attn, dtype, table_dtype, heads, kv_heads, head_size,
                                                rotary_dim, rank, strided, is_neox, key):
    tokens, extra = 5, 8 if strided else 0
    row = (heads, head_size) if rank == 3 else (heads * head_size,)  # [T, H, D] or [T, H * D]
    parent = randn(tokens, *row[:-1], row[-1] + extra, dtype=dtype, seed=1)
    query = parent[..., :row[-1]]  # strided: a token (rank 2) or head (rank 3) stride past the row
    key_in = randn(tokens, kv_heads, head_size, dtype=dtype, seed=2) if key else None
    if rank == 2 and key_in is not None:
        key_in = key_in.reshape(tokens, -1)
    table = rope_table(rotary_dim, table_dtype)
    positions = torch.tensor([0, 31, 7, 7, 12], device=DEVICE)
    parent_in, query_in = parent.clone(), query.clone()
    got_key = None if key_in is None else key_in.clone()
    flash_attn().rotary_embedding(positions, query, got_key, head_size, table, is_neox)
    for name, got, before in (("query", query, query_in), ("key", got_key, key_in)):
        if got is None:
            continue
        tail = got.reshape(tokens, -1, head_size)[..., rotary_dim:]
        assert torch.equal(tail, before.reshape(tokens, -1, head_size)[..., rotary_dim:]), f"{name}: tail changed"
        assert _outside_bound(got, before, positions, table, head_size, is_neox) == 0, f"{name}: past the bound"
    assert torch.equal(parent[..., row[-1]:], parent_in[..., row[-1]:]), "written outside the view"


PLANTED = {  # a bug in each path of rotary_kernel, and the statement it replaces
    "every token at the first token's position": (
        "rm_cs = rm + tl.load(SEQLEN_OFFSETS + pid_batch)", "rm_cs = rm + tl.load(SEQLEN_OFFSETS)"),
    "NeoX: the second half's sign": ("o1 = x0 * sin + x1 * cos\n        tl.store(OUT, o0, mask=mask)",
                                     "o1 = x0 * sin - x1 * cos\n        tl.store(OUT, o0, mask=mask)"),
    "GPT-J: the pair's halves joined swapped": ("tl.join(o0, o1)", "tl.join(o1, o0)"),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_kernel_bug_is_caught(flash_attn, bug):
    from mla_fuse_conformance.adapters.flash_attn_rotary import ROTARY_FILE, package_dir

    source = (package_dir() / ROTARY_FILE).read_text()
    written, planted_line = PLANTED[bug]
    assert source.count(written) == 1, f"rotary.py changed: update the planted bug {bug!r}"
    planted = source.replace(written, planted_line)
    positions, table = torch.tensor([3, 0, 9], device=DEVICE), rope_table(16, torch.float32)
    query = randn(3, 2, 16, dtype=torch.float32, seed=8)
    for is_neox in (True, False):
        counts = []
        for source_text in (None, planted):
            got = query.clone()
            flash_attn(source=source_text).rotary_embedding(positions, got, None, 16, table, is_neox)
            counts.append(_outside_bound(got, query, positions, table, 16, is_neox))
        assert counts[0] == 0
        hit = {"NeoX: the second half's sign": is_neox, "GPT-J: the pair's halves joined swapped": not is_neox}
        assert (counts[1] > 0) == hit.get(bug, True), (bug, is_neox, counts)


def test_the_declared_limit_is_apply_rotarys_assert_and_refused_before_writing(flash_attn):
    impl = flash_attn()
    assert impl.capabilities["rotary_embedding"].head_sizes == tuple(range(2, 257))
    assert (impl.rounding, impl.padded_rows, impl.checks_inputs) == ("single", "rotated", False)
    query = randn(2, 1, 258, dtype=torch.float32, seed=3)
    before = query.clone()
    with pytest.raises(AssertionError, match="Only support headdim <= 256"):
        impl.rotary_embedding(torch.tensor([0, 1], device=DEVICE), query, None, 258, rope_table(8, torch.float32), True)
    assert torch.equal(query, before)


@INTERPRETER_ONLY
def test_flash_attn_needs_the_correction_and_it_hides_no_truncating_kernel(flash_attn):
    from mla_fuse_conformance.adapters.flash_attn_rotary import ROTARY_FILE, package_dir

    firsts = {}
    for exact in (False, True):
        positions, query, key, table = bf16_tie_case()
        flash_attn(exact_bf16=exact).rotary_embedding(positions, query, key, 2, table, True)
        firsts[exact] = query[0, 0, 0].item()
    assert firsts == {False: 1.0, True: 1.0078125}, firsts
    # planted: flash-attn's NeoX store of the first half with explicit truncation still truncates
    source = (package_dir() / ROTARY_FILE).read_text()
    written = "tl.store(OUT, o0, mask=mask)\n"
    assert source.count(written) == 1, "rotary.py's NeoX store changed: update the planted bug"
    planted = source.replace(written, "tl.store(OUT, o0.to(tl.bfloat16, fp_downcast_rounding='rtz'), mask=mask)\n")
    positions, query, key, table = bf16_tie_case()
    flash_attn(source=planted).rotary_embedding(positions, query, key, 2, table, True)
    assert (query[0, 0, 0].item(), key[0, 0, 0].item()) == (1.0, 1.0), "both calls run the planted store"
    positions, query, key, table = bf16_tie_case()
    flash_attn(source=planted).rotary_embedding(positions, query, key, 2, table, False)
    assert query[0, 0, 0].item() == 1.0078125, "GPT-J's store is another statement, not planted"


def test_mla_fuse_verify_runs_it_on_one_models_deployments(flash_attn_root, verify_one_deployment):
    """The suite's own run of the adapter: Llama's rope calls pass."""
    code, report = verify_one_deployment("flash-attn-rotary", **({PATH_ENV_VAR: flash_attn_root} if flash_attn_root
                                                                  else {}))
    assert code == 0 and report["verdict"] == "PASS", report["deployments"]
    assert {entry["verdict"] for entry in report["deployments"]} == {"pass"}, report["deployments"]


# ---------------------------------------------------------------- the confirmed defect, by its second routes

REPRODUCER = pathlib.Path(__file__).parents[1] / "docs" / "upstream" / "flash-attn-rotary-int32-offsets.py"


def test_rows_2_31_elements_past_x_wrap_in_the_gpu_compile_too(flash_attn):
    """The suite's ``test_query_rows_a_huge_stride_apart`` crashes the worker under the interpreter. A GPU's
    compile does the same arithmetic: a batch stride that fits in int32 is passed as ``i32``
    (``mangle_type``), and line 51 ``X = X + pid_batch * stride_x_batch`` is an ``i32`` multiply feeding
    ``tt.addptr`` (the TTIR of a CUDA target, built without a GPU): 2 * (2^30 + 1) wraps to -2^31 + 2."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's CUDA backend builds the TTIR")
    import subprocess

    from mla_fuse_conformance.adapters.flash_attn_rotary import ROTARY_FILE, package_dir

    assert torch.tensor(2, dtype=torch.int32) * torch.tensor(2 ** 30 + 1, dtype=torch.int32) == -2 ** 31 + 2
    script = pathlib.Path(__file__).parent / "data" / "flash_attn_rotary_ttir.py"
    result = subprocess.run([sys.executable, str(script), str(package_dir() / ROTARY_FILE)], capture_output=True,
                            text=True, timeout=300,
                            env={key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "stride_x_batch = 1073741825 is passed as i32 (triton.runtime.jit.mangle_type)", lines
    product = lines[1].split(" = ")[0]
    assert lines[1].startswith(f"{product} = arith.muli %pid_batch, %stride_x_batch : i32"), lines
    assert f"tt.addptr %X, {product} : !tt.ptr<f16>, i32" in lines[2], lines


def _ram_and_swap() -> int:
    """MemTotal + SwapTotal in bytes (Linux), or 0: the largest single allocation the kernel's heuristic
    overcommit lets through."""
    try:
        fields = dict(line.split(":", 1) for line in pathlib.Path("/proc/meminfo").read_text().splitlines())
    except OSError:
        return 0
    return sum(int(fields.get(name, "0 kB").split()[0]) * 1024 for name in ("MemTotal", "SwapTotal"))


@INTERPRETER_ONLY
def test_the_standalone_reproducer_exits_1_on_the_defect_and_0_with_reference(flash_attn):
    """``docs/upstream/flash-attn-rotary-int32-offsets.py``: rows a 2^30 + 1 stride apart, the third written
    2^31 elements before x (inside the reproducer's buffer); with ``--reference`` (torch's rotation) it passes.
    Its buffer is 8 GiB of address space (pages allocated only where touched, a few MiB)."""
    import subprocess

    if _ram_and_swap() < 9 * 2 ** 30:
        pytest.skip("an 8 GiB buffer is refused where memory and swap total less than 9 GiB (heuristic overcommit)")

    from mla_fuse_conformance.adapters.flash_attn_rotary import ROTARY_FILE, package_dir

    codes = {}
    for flags in ((), ("--reference",)):
        result = subprocess.run([sys.executable, str(REPRODUCER), "--file", str(package_dir() / ROTARY_FILE), *flags],
                                capture_output=True, text=True, timeout=300)
        codes[flags] = (result.returncode, result.stdout)
    assert codes[()][0] == 1 and "rows rotated as torch rotates them: [True, True, False]" in codes[()][1], codes
    assert codes[("--reference",)][0] == 0, codes
