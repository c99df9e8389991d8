"""The ``gpu`` profile's cases compile a bounded number of kernel variants (docs/DESIGN.md, "Compiled variants").

Triton compiles one kernel per distinct *key*: the constexpr values, each pointer's element type
and 16-byte alignment, each integer argument's i32/i64 type, ``== 1`` and divisibility by 16
(unless ``do_not_specialize`` / ``do_not_specialize_on_alignment`` / a ``tl.int64`` annotation
say otherwise), and the compile options. The kernels now keep only structure in their keys:
dtypes, ``FP8_FORMAT``, ``IS_NEOX``, the power-of-two tiles (``BLOCK_*``), whether each exact size
fills its tile (``FULL_*``), and one ``ALIGNED`` flag (every vector row 16-byte aligned).

Method: a subprocess with ``TRITON_INTERPRET=0`` (GPU kernels, as ``test_aot_compile.py``) replaces
``JITFunction.run`` by the first half of Triton's own ``run``: the binder Triton generates from the
kernel's signature (``create_function_from_signature``, which applies ``do_not_specialize``, its
alignment twin and annotations; ``triton.compile``, the AOT path, applies none of them) and
``compute_cache_key``, for an sm_90 target; nothing compiles or runs. It draws the cases of the
five properties that compare an operation with the reference, with the ``gpu`` profile's
strategies and example count (``cases.sizes.LARGE``: model sizes, odd sizes, misaligned offsets,
strided views, engine layouts, deployments), derandomized; adds to each case a ``sibling`` (its
exact sizes moved inside their tiles, one more token, every tensor one element further into its
storage); builds them with the suite's own builders on allocation-cheap storage (uninitialised,
no values drawn: only sizes, strides, offsets and dtypes reach a key); calls the public ops of
``mla_fuse.ops``; and counts, per kernel, distinct keys and distinct *layouts* (the key reduced to
the pointers' dtypes, the structural constexprs and the options).

Two assertions per kernel:

1. keys == layouts: nothing but structure splits a compile (an exact size made a constexpr again,
   a dropped ``do_not_specialize`` or an integer's/pointer's specialisation shows here, whatever
   the budget: a case and its sibling share a layout and must share the key).
2. keys <= ``BUDGET``. The budget is the structure these cases need, measured (47-76 layouts per
   kernel over 314-367 launches, docs/DESIGN.md) plus about 20% so that a Hypothesis upgrade
   that draws slightly different cases does not fail it. Going over means a kernel gained
   structure (a new constexpr flag, a tile that is not a power of two of its size): review it.

And per launch: each case is called twice on the same buffers, so each kernel launches through
``launcher.Launcher``'s table of compiled kernels (a later case of a known key) and through a plan's
kept launch (the repeated call); each of those launches must be the one Triton's ``run`` would make
for that call (its compile key, grid, arguments as the C launcher reads them, stream: ``_Compiled``),
and a kept launch, with no launch hook registered, calls the compiled kernel's launcher with the
kernel's own handles and no hooks.

The binder is a private Triton API: the test is pinned to the Triton version CI's main job
installs (``PINNED_TRITON``) and skipped elsewhere. It takes about 25 s on a 2-core machine
(drawing the 1000 cases is most of it).

``python tests/test_compile_keys.py --worker [N] [--timing] [--seeds S ...]`` prints the counts (``N``
cases per operation; ``--timing``: host microseconds per launch with ``JITFunction.run`` a no-op;
``--seeds``: the keys of ``N`` cases per operation drawn from each seed, and how many of them the
derandomized cases share); with
``PYTHONPATH`` at another checkout's packages it counts that checkout's kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINNED_TRITON = "3.9.0"
EXAMPLES = 200  # cases drawn per operation: the gpu profile runs 200 examples per property
# (operation, strategy name, fused): the properties that compare each operation with the reference
OPERATIONS = (
    ("rotary_embedding", "rope_cases", None),
    ("concat_and_cache_mla", "mla_cases", False),
    ("concat_and_cache_mla_rope_fused", "mla_cases", True),
    ("reshape_and_cache_flash", "flash_cases", False),
    ("rope_and_reshape_and_cache_flash", "flash_cases", True),
)
KERNEL_OF_OPERATION = {
    "rotary_embedding": "rotary_embedding_kernel",
    "concat_and_cache_mla": "mla_cache_kernel",
    "concat_and_cache_mla_rope_fused": "mla_rope_cache_kernel",
    "reshape_and_cache_flash": "flash_cache_kernel",
    "rope_and_reshape_and_cache_flash": "flash_rope_cache_kernel",
}
# the constexprs that are structure: the tiles, whether a size fills its tile, the formats and flags; a
# constexpr outside these (an exact size, say) is a specialisation the test reports
STRUCTURAL_CONSTEXPRS = ("IS_NEOX", "FP8_FORMAT", "HAS_KEY", "HAS_TAIL", "ALIGNED")
STRUCTURAL_PREFIXES = ("BLOCK_", "FULL_")
# distinct keys allowed per kernel over the EXAMPLES cases of its operation and their siblings: measured
# layouts (triton 3.9.0, hypothesis of this checkout) + ~20% (module docstring)
BUDGET = {
    "rotary_embedding_kernel": 90,  # measured 76
    "mla_cache_kernel": 56,  # measured 47
    "mla_rope_cache_kernel": 64,  # measured 53
    "flash_cache_kernel": 62,  # measured 51
    "flash_rope_cache_kernel": 88,  # measured 73
}


# ---------------------------------------------------------------- the subprocess (TRITON_INTERPRET=0)


def _cheap_builders() -> None:
    """Build cases with the suite's builders, minus the cost of values: storage is uninitialised
    (``torch.empty``: 64-byte aligned like a GPU allocation, so a view's alignment is its offset's),
    no activations or table rows are computed. Index tensors (positions, slots) stay real."""
    import torch

    from mla_fuse_conformance.cases import memory, tensors

    def buffer_init(self, name, numel, dtype, device, seed, fill=None):
        self.name, self.dtype, self.views = name, dtype, {}
        numel = max(numel, 1)
        self.flat = torch.empty(numel, dtype=dtype) if fill is None else torch.full((numel,), fill, dtype=dtype)

    def table_tensor(spec, input_dtype, positions):
        dtype = input_dtype if spec.dtype == "input" else tensors.DTYPES[spec.dtype]
        return torch.empty(spec.num_positions, spec.rotary_dim, dtype=dtype)

    memory.Buffer.__init__ = buffer_init
    tensors.table_tensor = table_tensor
    tensors.activation_values = lambda *args, **kwargs: None
    tensors._fill = lambda view, values: None


def _draw(strategy, count: int) -> list:
    """``count`` cases of ``strategy`` under the gpu profile, derandomized (the same cases every run)."""
    from hypothesis import HealthCheck, Phase, given, settings

    drawn = []

    @settings(settings.get_profile("mla_fuse.gpu"), max_examples=count, derandomize=True, database=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def collect(case):
        drawn.append(case)

    collect()
    return drawn


def _draw_seeded(strategy, count: int, seed: int) -> list:
    """``count`` cases of ``strategy`` under the gpu profile as a run with ``--hypothesis-seed=seed`` draws
    them. (``_draw``'s source is left as it is: a derandomized draw depends on the test function's source.)"""
    import hypothesis
    from hypothesis import HealthCheck, Phase, given, settings

    drawn = []

    @hypothesis.seed(seed)
    @settings(settings.get_profile("mla_fuse.gpu"), max_examples=count, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def collect(case):
        drawn.append(case)

    collect()
    return drawn


def _within_tile(size: int) -> int:
    """Another size with the same power-of-two tile, as full or as partial as ``size`` (else ``size``)."""
    tile = 1 << max(size - 1, 0).bit_length()
    if size == tile:
        return size
    other = size - 1 if size - 1 > tile // 2 else size + 1
    return other if other < tile else size


def sibling(case):
    """``case`` with its exact sizes moved within their tiles (latent, head sizes, rotary width), one
    more token, and every tensor one element further into its storage; None where that is no case.

    A kernel that compiles by structure gives the sibling the case's key whenever it has the case's
    structure (dtypes, tiles, flags, ``ALIGNED``); an exact size, an integer's value or one pointer's
    alignment in the key splits them.
    """
    import dataclasses

    from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, RopeCase

    rotary_dim = 2 * _within_tile(case.table.rotary_dim // 2)
    changes = dict(table=dataclasses.replace(case.table, rotary_dim=rotary_dim), tokens=case.tokens + 1)
    changes.update({field.name: dataclasses.replace(getattr(case, field.name), lead=getattr(case, field.name).lead + 1)
                    for field in dataclasses.fields(case) if isinstance(getattr(case, field.name), Placement)})
    if isinstance(case, MlaCase):
        changes.update(latent=_within_tile(case.latent), rotary_dim=rotary_dim)
    elif isinstance(case, (FlashCase, RopeCase)):
        head_size = _within_tile(case.head_size)
        if rotary_dim > head_size or (case.head_size == case.table.rotary_dim) != (head_size == rotary_dim):
            return None
        changes.update(head_size=head_size)
        if isinstance(case, FlashCase):
            same = case.value_head_size == case.head_size
            changes.update(value_head_size=head_size if same else _within_tile(case.value_head_size))
    return None if case.tokens == 0 else dataclasses.replace(case, **changes)


STREAM = 12345  # the stream the worker's launcher reports; a launch through the table must be given it
# what each launch through a Launcher's table must get right (``_Compiled``)
LAUNCH_CHECKS = ("same_key", "same_grid", "same_args", "same_stream", "same_handles")


def _passed(value):
    """What the compiled kernel's C launcher reads of an argument: a tensor's address, else the value."""
    import torch

    return value.data_ptr() if isinstance(value, torch.Tensor) else value


class _Compiled:
    """What ``JITFunction.run`` returns here in place of a ``CompiledKernel``: the key it was "compiled"
    under, its runner (``compiled[grid](*args, stream=)``) and its launcher (``compiled.run(*grid,
    stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``, which a
    plan's kept launch calls while no launch hook is registered), as ``CompiledKernel``'s. Each compares
    the launch ``launcher.Launcher`` makes through it (through its table, or again through a plan's
    kept launch) with the launch Triton's ``run`` would have made for that call (``intended``: its key,
    grid and arguments in signature order, each tensor as the address the C launcher reads); the
    launcher must also be given this kernel's handles and no hooks."""

    function, packed_metadata = 0xF00, ("packed", "metadata")

    def __init__(self, key, intended, direct):
        self.key, self.intended, self.direct = key, intended, direct

    def __getitem__(self, grid):
        return lambda *args, stream=None: self._record(grid, stream, args, True, "runner")

    def run(self, grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata, enter, leave, *args):
        self._record((grid_x, grid_y, grid_z), stream, args,
                     (function, packed_metadata, launch_metadata, enter, leave)
                     == (self.function, self.packed_metadata, None, None, None), "launcher")

    def _record(self, grid, stream, args, same_handles, path):
        kernel, key, bound, wanted_grid, again = self.intended[0]
        self.direct.append(dict(kernel=kernel, same_key=self.key == key, same_grid=tuple(grid) == wanted_grid,
                                same_args=list(map(_passed, args)) == list(map(_passed, bound)),
                                same_stream=stream == STREAM, same_handles=same_handles, again=again, path=path))


def _key_recorder(keys: dict, direct: list, repeating: list):
    """``(run, call)``: ``run`` replaces ``JITFunction.run`` (records nothing: returns a ``_Compiled``
    of the call's key); ``call`` replaces ``Launcher.__call__``: it records the key Triton's ``run``
    would compile the call under, for sm_90, then calls the Launcher, whose launches through its table
    or a plan's kept launch (``launcher.Plan.again``) append to ``direct``; ``repeating[0]`` says the
    call repeats the one before (not counted again)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import compute_cache_key, create_function_from_signature

    from mla_fuse.kernels.launcher import Launcher

    backend = make_backend(GPUTarget("cuda", 90, 32))
    binders, intended = {}, [None]
    launch = Launcher.__call__

    def triton_key(fn, args, kwargs):
        if fn not in binders:
            binders[fn] = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binders[fn](*args, **kwargs)
        return compute_cache_key({}, specialization, options), specialization, options, list(bound.values())

    def call(self, plan, *tensors):
        fn, grid = self.kernel, plan.grid
        key, specialization, options, bound = triton_key(fn, plan.arguments(tensors),
                                                         dict(plan.constexprs, ALIGNED=plan.aligned))
        layout = (tuple((name, kind) for name, (kind, *_) in zip(fn.arg_names, specialization) if kind[0] == "*")
                  + tuple((name, value) for name, (kind, value) in zip(fn.arg_names, specialization)
                          if kind == "constexpr" and structural(name)) + (str(options),))
        if not repeating[0]:  # a repeated call (same buffers) is counted once
            keys.setdefault(fn.__name__, []).append((key, layout))
        intended[0] = (fn.__name__, key, bound, (*grid, 1, 1)[:3], plan.again is not None)
        launch(self, plan, *tensors)

    def run(self, *args, grid, warmup, **kwargs):
        return _Compiled(triton_key(self, args, kwargs)[0], intended, direct)

    return run, call


def structural(name: str) -> bool:
    """Whether a constexpr is one the kernels declare as structure (``STRUCTURAL_CONSTEXPRS``)."""
    return name in STRUCTURAL_CONSTEXPRS or name.startswith(STRUCTURAL_PREFIXES)


def _call(ops, operation: str, args: dict) -> None:
    from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS

    names = {"kv_cache_scale": "scale"}  # the fused MLA op's scale is the suite's "scale" buffer
    getattr(ops, operation)(*(args[names.get(name, name)] for name in OPERATION_ARGUMENTS[operation]))


def _timing(ops, operation: str, args: dict, repeats: int = 2000, rounds: int = 7) -> dict:
    """Host microseconds per call (best of ``rounds``) of the fused MLA op and of its kernel module's
    ``launch`` (on a new layout, and on a known one: its plan kept in the layout's slot, launched
    with no launch hook registered and with one), Triton's compiled kernel with its C launcher a
    no-op (what our side and Triton's Python cost up to that launcher), and of the work Triton's
    ``JITFunction.run`` does on every call before that launcher, which ``launcher.Launcher`` does
    once per layout: the binder and the compile key, for sm_90."""
    import inspect

    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, CompiledKernel, make_backend
    from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature

    from mla_fuse.kernels import mla_rope_cache

    class NoLaunch(CompiledKernel):  # Triton's own runner and launch metadata; the C launcher does nothing
        def __init__(self, kernel):
            self.module, self._module_pid, self.function, self.packed_metadata = object(), None, 0, ()
            self.name, self.hash, self.metadata, self.src = kernel.fn.__name__, "", None, ASTSource.__new__(ASTSource)
            self.src.fn = kernel
            self._run = lambda *args: None

    calls = []
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: calls.append((self, args, kwargs)) or NoLaunch(self)
    names = list(inspect.signature(mla_rope_cache.launch).parameters)[:-1]  # all but the layout's slot
    values = dict(args, fp8_format=None)
    launch_args = [values[name] for name in names]
    mla_rope_cache.launcher.compiled.clear()  # its first launch goes through JITFunction.run, recorded
    mla_rope_cache.launch(*launch_args)
    kernel, bound, kwargs = calls[-1]
    binder = create_function_from_signature(kernel.signature, kernel.params, make_backend(GPUTarget("cuda", 90, 32)))
    key_cache = {}

    def triton_run_prelude():
        _, specialization, options = binder(*bound, **kwargs)
        return compute_cache_key(key_cache, specialization, options)

    def best(call) -> float:
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            times.append((time.perf_counter() - start) / repeats * 1e6)
        return round(min(times), 2)

    slot = [None]  # validation's slot of a known layout: the launch plan is kept there after the first call
    figures = {"op_us": best(lambda: _call(ops, operation, args)),
               "launch_us": best(lambda: mla_rope_cache.launch(*launch_args)),
               "launch_known_layout_us": best(lambda: mla_rope_cache.launch(*launch_args, slot=slot)),
               "triton_bind_and_key_us": best(triton_run_prelude)}
    hook = lambda metadata: None  # noqa: E731  (a profiler's launch hook: the kept launch takes Triton's runner)
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        figures["launch_known_layout_hooked_us"] = best(lambda: mla_rope_cache.launch(*launch_args, slot=slot))
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    return figures


def _timing_case():
    from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec

    # a DeepSeek-V3 decode step: T=64, H=16 (TP 8), L=512, R=64, bf16, auto cache
    return MlaCase(seed=1, tokens=64, heads=16, latent=512, rotary_dim=64, dtype="bfloat16", kv_cache_dtype="auto",
                   num_blocks=8, block_size=64, slots=SlotSpec(64), table=TableSpec("plain", 64, 4096),
                   is_neox=False)


def worker(count: int, timing: bool, seeds: list[int] = ()) -> None:
    """Print one JSON line: distinct keys per kernel (and calls per kernel) over ``count`` cases per op;
    with ``seeds``, also per seed and kernel the keys of ``count`` cases per op drawn from that seed
    and how many of them the derandomized cases have too (what a cache kept from another run holds)."""
    assert os.environ.get("TRITON_INTERPRET") == "0"
    os.environ["MLA_FUSE_PROPERTY_SIZES"] = "large"  # cases.sizes.LARGE, as the gpu profile
    from triton.runtime.jit import JITFunction

    keys: dict[str, list] = {}
    direct: list[dict] = []
    from mla_fuse.kernels import launcher

    launcher_call = launcher.Launcher.__call__
    repeating = [False]
    JITFunction.run, launcher.Launcher.__call__ = _key_recorder(keys, direct, repeating)
    from mla_fuse import ops, validation
    from mla_fuse_conformance.cases import strategies, tensors
    from mla_fuse_conformance.settings import profiles  # noqa: F401  (registers mla_fuse.gpu)

    validation.require_kernel_device = lambda *args: None  # CPU tensors: launches are recorded, never run
    launcher.current_device = lambda: 0  # no GPU driver here
    launcher.current_stream = lambda device: STREAM
    _cheap_builders()
    started = time.perf_counter()
    cases = {}
    for operation, name, fused in OPERATIONS:
        strategy = getattr(strategies, name)() if fused is None else getattr(strategies, name)(fused=fused)
        cases[operation] = _draw(strategy, count) if count else []
    drawn = time.perf_counter()
    siblings = {}
    for operation, operation_cases in cases.items():
        siblings[operation] = [moved for moved in map(sibling, operation_cases) if moved is not None]
        for case in operation_cases + siblings[operation]:
            args = tensors.build(case, "cpu").args
            _call(ops, operation, args)
            repeating[0] = True  # the same buffers again: a known layout, its plan's kept launch
            _call(ops, operation, args)
            repeating[0] = False
    result = {"keys": {kernel: len({key for key, _ in found}) for kernel, found in sorted(keys.items())},
              "layouts": {kernel: len({layout for _, layout in found}) for kernel, found in sorted(keys.items())},
              "launches": {kernel: len(found) for kernel, found in sorted(keys.items())},
              "direct": {kernel: sum(1 for launch in direct if launch["kernel"] == kernel) for kernel in sorted(keys)},
              "again": {kernel: sum(1 for launch in direct if launch["kernel"] == kernel and launch["again"])
                        for kernel in sorted(keys)},
              "again_through_runner": sum(1 for launch in direct if launch["again"] and launch["path"] == "runner"),
              "direct_wrong": [launch for launch in direct if not all(launch[check] for check in LAUNCH_CHECKS)][:5],
              "cases": {op: len(found) for op, found in cases.items()},
              "siblings": {op: len(found) for op, found in siblings.items()},
              "seconds": {"draw": round(drawn - started, 1), "build_and_call": round(time.perf_counter() - drawn, 1)}}
    derandomized = {kernel: {key for key, _ in found} for kernel, found in keys.items()}
    result["seeds"] = {}
    for seed in seeds:
        keys.clear()
        for operation, name, fused in OPERATIONS:
            strategy = getattr(strategies, name)() if fused is None else getattr(strategies, name)(fused=fused)
            for case in _draw_seeded(strategy, count, seed):
                _call(ops, operation, tensors.build(case, "cpu").args)
        result["seeds"][seed] = {kernel: [len({key for key, _ in found}),
                                          len({key for key, _ in found} & derandomized.get(kernel, set()))]
                                 for kernel, found in sorted(keys.items())}
    if timing:
        launcher.Launcher.__call__ = launcher_call
        result["timing"] = _timing(ops, "concat_and_cache_mla_rope_fused",
                                   tensors.build(_timing_case(), "cpu").args)
    print("COMPILE-KEYS " + json.dumps(result))


# ---------------------------------------------------------------- the test


def count_keys(count: int = EXAMPLES, pythonpath: str | None = None, timing: bool = False) -> dict:
    path = pythonpath or os.pathsep.join([os.path.join(ROOT, ".shim"), ROOT, os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, os.path.abspath(__file__), "--worker", str(count)] + (["--timing"] if timing else [])
    with tempfile.TemporaryDirectory() as cache:  # nothing compiles; a first launch's lock file lands here
        env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path, TRITON_CACHE_DIR=cache)
        env.pop("MLA_FUSE_TRITON_BACKEND", None)
        process = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    lines = [line for line in process.stdout.splitlines() if line.startswith("COMPILE-KEYS ")]
    assert process.returncode == 0 and lines, f"worker failed:\n{process.stdout[-3000:]}\n{process.stderr[-5000:]}"
    return json.loads(lines[-1][len("COMPILE-KEYS "):])


def _triton_version() -> str:
    import triton

    return triton.__version__


@pytest.mark.skipif(_triton_version() != PINNED_TRITON,
                    reason=f"computes Triton's compile keys with its private binder API, pinned to triton "
                           f"{PINNED_TRITON} (CI's main job); this is triton {_triton_version()}")
def test_gpu_profile_compiles_within_budget():
    """Per kernel: only structure splits a compile, and the structure stays within ``BUDGET``."""
    result = count_keys()
    assert result["cases"] == {op: EXAMPLES for op, *_ in OPERATIONS}, result
    assert set(result["keys"]) == set(BUDGET), result
    keys, layouts = result["keys"], result["layouts"]
    split = {kernel: f"{keys[kernel]} keys for {layouts[kernel]} layouts" for kernel in keys
             if keys[kernel] != layouts[kernel]}
    assert not split, (f"something besides structure (an exact size, an integer's value, a pointer's alignment) is "
                       f"in the compile key: {split}")
    assert all(result["direct"].values()), f"a kernel never launched through its Launcher's table: {result['direct']}"
    assert all(result["again"].values()), f"a kernel never launched through a plan's kept launch: {result['again']}"
    assert result["again_through_runner"] == 0, ("with no launch hook registered a kept launch called the compiled "
                                                 "kernel's runner, not its launcher")
    assert not result["direct_wrong"], (f"a launch through a Launcher's table or a plan's kept launch is not the "
                                        f"launch Triton's run would make (another compile key, grid, arguments, "
                                        f"stream or kernel handles): {result['direct_wrong']}")
    over = {kernel: f"{found}/{BUDGET[kernel]}" for kernel, found in keys.items() if found > BUDGET[kernel]}
    assert not over, f"compiled variants over budget (keys/budget): {over}; all: {keys}"


if __name__ == "__main__" and "--worker" in sys.argv:
    position = sys.argv.index("--worker")
    worker(int(sys.argv[position + 1]) if len(sys.argv) > position + 1 and sys.argv[position + 1].isdigit()
           else EXAMPLES, "--timing" in sys.argv,
           [int(seed) for seed in sys.argv[sys.argv.index("--seeds") + 1:]] if "--seeds" in sys.argv else [])
