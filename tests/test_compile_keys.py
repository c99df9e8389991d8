"""The ``gpu`` profile's cases compile a bounded number of kernel variants (docs/DESIGN.md, "Compiled variants").

Triton compiles one kernel per distinct *key*: the constexpr values, each pointer's element type
and 16-byte alignment, each integer argument's i32/i64 type, ``== 1`` and divisibility by 16
(unless ``do_not_specialize`` / ``do_not_specialize_on_alignment`` / a ``tl.int64`` annotation
says otherwise), and the compile options. On an H200 the ``gpu`` profile used to be compile-bound:
exact sizes were constexprs, so every drawn size was a new kernel.

Method: a subprocess with ``TRITON_INTERPRET=0`` (GPU kernels, as ``test_aot_compile.py``) replaces
``JITFunction.run`` by the first half of Triton's own ``run``: the binder Triton generates from the
kernel's signature (``create_function_from_signature``, which honours ``do_not_specialize``, its
alignment twin and annotations) and ``compute_cache_key``, for an sm_90 target; nothing compiles
or runs. It draws the cases of the five properties that call each operation against the reference
with the ``gpu`` profile's strategies (``cases.sizes.LARGE``: model sizes, odd sizes, misaligned
offsets, strided views, engine layouts, deployments), derandomized, ``EXAMPLES`` per operation,
builds them with the suite's own builders (``cases.tensors.build``) on allocation-cheap storage
(uninitialised, no values drawn: only sizes, strides, offsets and dtypes reach a key), calls the
public ops of ``mla_fuse.ops`` and counts distinct keys per kernel.

Budget (``BUDGET``): what each kernel's structure needs, measured on these cases with headroom.
Per kernel the structural factors are the dtypes (activations 3, table fp32/input 2, positions
and slot_mapping int32/int64 2 each), ``FP8_FORMAT`` 3, ``IS_NEOX`` 2, the power-of-two tiles
(``BLOCK_*``, a handful per size), whether each exact size fills its tile (``FULL_*``), and the
16-byte alignment / divisibility kept on the pointers and strides of the rows that are loaded
and stored as vectors (kept on purpose: it is what gives 16-byte vector accesses on a GPU). The
product is far above what 200 cases reach, so the budget is set from the measured count
(``EXAMPLES`` cases per operation give at most that many keys): about half of the cases may be
new kernels, not (as before) nearly all of them. A regression that makes a size or an index
stride a specialisation again (a constexpr ``LATENT``, a dropped ``do_not_specialize``) pushes
the count of its kernel back towards ``EXAMPLES``.

The binder is a private Triton API: the test is pinned to the Triton version CI's main job
installs (``PINNED_TRITON``) and skipped elsewhere.

``python tests/test_compile_keys.py --worker [N]`` prints the counts (``--timing`` adds host-side
microseconds per launch with ``JITFunction.run`` stubbed); point ``PYTHONPATH`` at another checkout
to count its kernels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
# distinct keys allowed per kernel over EXAMPLES cases of its operation (see the module docstring)
BUDGET = {
    "rotary_embedding_kernel": 60,
    "mla_cache_kernel": 60,
    "mla_rope_cache_kernel": 60,
    "flash_cache_kernel": 60,
    "flash_rope_cache_kernel": 60,
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


def _key_recorder(keys: dict):
    """A ``JITFunction.run`` that records the key Triton's ``run`` would compile under, for sm_90."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import compute_cache_key, create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    binders = {}

    def run(self, *args, grid, warmup, **kwargs):
        if self not in binders:
            binders[self] = create_function_from_signature(self.signature, self.params, backend)
        _, specialization, options = binders[self](*args, **kwargs)
        keys.setdefault(self.__name__, []).append(compute_cache_key({}, specialization, options))

    return run


def _call(ops, operation: str, args: dict) -> None:
    from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS

    names = {"kv_cache_scale": "scale"}  # the fused MLA op's scale is the suite's "scale" buffer
    getattr(ops, operation)(*(args[names.get(name, name)] for name in OPERATION_ARGUMENTS[operation]))


def _timing(ops, operation: str, args: dict, repeats: int = 3000) -> dict:
    """Host microseconds per call of the op and of its kernel module's ``launch``, ``run`` a no-op."""
    import inspect

    from mla_fuse.kernels import mla_rope_cache

    launches = []
    from triton.runtime.jit import JITFunction

    JITFunction.run = lambda self, *a, grid, warmup, **k: launches.append(1)
    result = {}
    for _ in range(2):  # the second round is the one reported (warm caches)
        start = time.perf_counter()
        for _ in range(repeats):
            _call(ops, operation, args)
        result["op_us"] = (time.perf_counter() - start) / repeats * 1e6
    names = list(inspect.signature(mla_rope_cache.launch).parameters)
    values = dict(positions=args["positions"], q_pe=args["q_pe"], k_pe=args["k_pe"], kv_c=args["kv_c"],
                  cos_sin_cache=args["cos_sin_cache"], is_neox=args["is_neox"], slot_mapping=args["slot_mapping"],
                  kv_cache=args["kv_cache"], fp8_format=None, scale=args["scale"])
    launch_args = [values[name] for name in names]
    for _ in range(2):
        start = time.perf_counter()
        for _ in range(repeats):
            mla_rope_cache.launch(*launch_args)
        result["launch_us"] = (time.perf_counter() - start) / repeats * 1e6
    return result


def _timing_case():
    from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec

    # a DeepSeek-V3 decode step: T=64, H=16 (TP 8), L=512, R=64, bf16, auto cache
    return MlaCase(seed=1, tokens=64, heads=16, latent=512, rotary_dim=64, dtype="bfloat16", kv_cache_dtype="auto",
                   num_blocks=8, block_size=64, slots=SlotSpec(64), table=TableSpec("plain", 64, 4096),
                   is_neox=False)


def worker(count: int, timing: bool) -> None:
    """Print one JSON line: distinct keys per kernel (and calls per kernel) over ``count`` cases per op."""
    assert os.environ.get("TRITON_INTERPRET") == "0"
    os.environ["MLA_FUSE_PROPERTY_SIZES"] = "large"  # cases.sizes.LARGE, as the gpu profile
    from triton.runtime.jit import JITFunction

    keys: dict[str, list] = {}
    JITFunction.run = _key_recorder(keys)
    from mla_fuse import ops, validation
    from mla_fuse_conformance.cases import strategies, tensors
    from mla_fuse_conformance.settings import profiles  # noqa: F401  (registers mla_fuse.gpu)

    validation.require_kernel_device = lambda *args: None  # CPU tensors: launches are recorded, never run
    _cheap_builders()
    started = time.perf_counter()
    cases = {}
    for operation, name, fused in OPERATIONS:
        strategy = getattr(strategies, name)() if fused is None else getattr(strategies, name)(fused=fused)
        cases[operation] = _draw(strategy, count)
    drawn = time.perf_counter()
    for operation, operation_cases in cases.items():
        for case in operation_cases:
            _call(ops, operation, tensors.build(case, "cpu").args)
    result = {"keys": {kernel: len(set(found)) for kernel, found in sorted(keys.items())},
              "launches": {kernel: len(found) for kernel, found in sorted(keys.items())},
              "cases": {op: len(found) for op, found in cases.items()},
              "seconds": {"draw": round(drawn - started, 1), "build_and_call": round(time.perf_counter() - drawn, 1)}}
    if timing:
        result["timing"] = _timing(ops, "concat_and_cache_mla_rope_fused",
                                   tensors.build(_timing_case(), "cpu").args)
    print("COMPILE-KEYS " + json.dumps(result))


# ---------------------------------------------------------------- the test


def count_keys(count: int = EXAMPLES, pythonpath: str | None = None, timing: bool = False) -> dict:
    path = pythonpath or os.pathsep.join([os.path.join(ROOT, ".shim"), ROOT, os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path)
    env.pop("MLA_FUSE_TRITON_BACKEND", None)
    command = [sys.executable, os.path.abspath(__file__), "--worker", str(count)] + (["--timing"] if timing else [])
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
    """Distinct compile keys per kernel over the gpu profile's cases stay within ``BUDGET``."""
    result = count_keys()
    assert result["cases"] == {op: EXAMPLES for op, *_ in OPERATIONS}, result
    assert set(result["keys"]) == set(BUDGET), result
    over = {kernel: found for kernel, found in result["keys"].items() if found > BUDGET[kernel]}
    assert not over, (f"compiled variants over budget (distinct keys / budget, over {EXAMPLES} gpu-profile cases "
                      f"per operation): {({k: f'{v}/{BUDGET[k]}' for k, v in over.items()})}; all: {result['keys']}")


if __name__ == "__main__" and "--worker" in sys.argv:
    position = sys.argv.index("--worker")
    worker(int(sys.argv[position + 1]) if len(sys.argv) > position + 1 and sys.argv[position + 1].isdigit()
           else EXAMPLES, "--timing" in sys.argv)
