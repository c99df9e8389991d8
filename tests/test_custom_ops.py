"""The ``mla_fuse::*`` custom ops: registration, schemas, fakes and ``torch.library.opcheck``.

``opcheck`` runs the schema check (only the declared arguments are mutated,
with the declared aliasing), the autograd registration check, the fake-tensor
check (the fake matches the real op's metadata) and AOT dispatch with dynamic
shapes, on real inputs of each op.
"""

from __future__ import annotations

import pytest
import torch

from mla_fuse import ops  # registers the mla_fuse::* ops
from mla_fuse_conformance.contract.implementation import OPERATIONS, load_implementation
from mla_fuse_reference import rope as ref_rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MUTATED = {
    "rotary_embedding": {"query", "key"},
    "concat_and_cache_mla": {"kv_cache"},
    "concat_and_cache_mla_rope_fused": {"q_pe", "k_pe", "kv_cache"},
    "reshape_and_cache_flash": {"key_cache", "value_cache"},
    "rope_and_reshape_and_cache_flash": {"query", "key", "key_cache", "value_cache"},
}


def _randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=torch.float32, device=DEVICE).to(dtype)


def _table(rotary_dim):
    return ref_rope.plain_cos_sin_cache(rotary_dim, 64).to(DEVICE)


def _positions(num_tokens):
    return torch.randint(0, 64, (num_tokens,), device=DEVICE)


def _slots(*values):
    return torch.tensor(values, device=DEVICE)


def _scale(*values):
    return torch.tensor(values, dtype=torch.float32, device=DEVICE)


def sample_inputs():
    """(op name, args, id) covering optional key, fp8/auto caches, strided views."""
    t, h, hkv, d, r, l = 5, 2, 1, 16, 16, 24
    kv = _randn(t, l + r)
    q = _randn(t, h, 8 + r)
    yield "rotary_embedding", (_positions(t), _randn(t, h, d), _randn(t, hkv, d), d, _table(r), True), "q_k"
    yield "rotary_embedding", (_positions(t), _randn(t, h * d), None, d, _table(r), False), "query_only_flat"
    yield ("concat_and_cache_mla",
           (kv[:, :l], kv[:, l:], torch.zeros(3, 4, l + r, dtype=torch.uint8, device=DEVICE), _slots(0, -1, 7, 3),
            "fp8", _scale(0.5)), "fp8_uint8")
    yield ("concat_and_cache_mla",
           (kv[:, :l], kv[:, l:], torch.zeros(3, 4, l + r, dtype=torch.bfloat16, device=DEVICE), _slots(5, 2, -1, 0, 9),
            "auto", _scale(1.0)), "auto")
    yield ("concat_and_cache_mla_rope_fused",
           (_positions(t), q[..., 8:], kv[:, l:], kv[:, :l], _table(r), False, _slots(1, -1, 4),
            torch.zeros(3, 4, l + r, dtype=torch.uint8, device=DEVICE), "fp8_e4m3", _scale(0.25)),
           "fp8_e4m3_strided")  # float8-dtype caches: test_kernels (opcheck's schema check cannot multiply them)
    yield ("reshape_and_cache_flash",
           (_randn(t, hkv, d), _randn(t, hkv, 8), torch.zeros(2, 4, hkv, d, dtype=torch.uint8, device=DEVICE),
            torch.zeros(2, 4, hkv, 8, dtype=torch.uint8, device=DEVICE), _slots(0, 1, -1, 6, 2), "fp8_e5m2",
            _scale(0.5), _scale(2.0)), "fp8_e5m2")
    yield ("rope_and_reshape_and_cache_flash",
           (_positions(t), _randn(t, h, d), _randn(t, hkv, d), _randn(t, hkv, d),
            torch.zeros(2, 4, hkv, d, dtype=torch.bfloat16, device=DEVICE),
            torch.zeros(2, 4, hkv, d, dtype=torch.bfloat16, device=DEVICE), _slots(3, 0, -1), _table(8), True, "auto",
            _scale(1.0), _scale(1.0)), "auto_partial_rotary")


SAMPLES = list(sample_inputs())


@pytest.mark.parametrize("name, args", [(n, a) for n, a, _ in SAMPLES], ids=[f"{n}-{i}" for n, _, i in SAMPLES])
def test_opcheck(name, args):
    torch.library.opcheck(getattr(torch.ops.mla_fuse, name).default, args)


@pytest.mark.parametrize("name", OPERATIONS)
def test_schema_declares_exactly_the_written_arguments(name):
    schema = getattr(torch.ops.mla_fuse, name).default._schema
    mutated = {argument.name for argument in schema.arguments
               if argument.alias_info is not None and argument.alias_info.is_write}
    assert mutated == MUTATED[name]
    assert len(schema.returns) == 0


@pytest.mark.parametrize("name", OPERATIONS)
def test_public_wrapper_has_the_op_signature_plus_check_values(name):
    import inspect

    schema = getattr(torch.ops.mla_fuse, name).default._schema
    parameters = inspect.signature(getattr(ops, name)).parameters
    assert list(parameters)[:-1] == [argument.name for argument in schema.arguments]
    assert parameters["check_values"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize("name, args", [(n, a) for n, a, i in SAMPLES if i in ("q_k", "fp8_e4m3_strided")],
                         ids=["rotary_embedding", "concat_and_cache_mla_rope_fused"])
def test_a_call_bumps_the_version_of_each_written_argument(name, args):
    """As an aten in-place op (and ``custom_op``'s ADInplaceOrView layer) does: autograd sees the writes.
    Views of one tensor share its version counter, so a read argument moves only with a written view."""
    tensors = {s.name: a for s, a in zip(getattr(torch.ops.mla_fuse, name).default._schema.arguments, args)
               if isinstance(a, torch.Tensor)}
    before = {n: t._version for n, t in tensors.items()}
    getattr(torch.ops.mla_fuse, name)(*args)
    bumped = {n for n, t in tensors.items() if t._version > before[n]}
    storage = {n: t.untyped_storage().data_ptr() for n, t in tensors.items()}
    assert bumped == {n for n in tensors if any(storage[n] == storage[w] for w in MUTATED[name])}
    assert MUTATED[name] <= bumped


def test_the_ops_are_registered_without_python_autograd_layers():
    """``Library.define`` + ``impl`` (vLLM's ``direct_register_custom_op``): no Autograd or ADInplaceOrView
    kernel of ours on the hot path; the CPU and CUDA kernels and the fake's Meta kernel."""
    for name in OPERATIONS:
        qualname = f"mla_fuse::{name}"
        registered = {key for key in ("CPU", "CUDA", "Meta", "Autograd", "ADInplaceOrView", "CompositeExplicitAutograd")
                      if torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)}
        assert registered == {"CPU", "CUDA", "Meta"}, name


def test_triton_implementation_is_registered_and_complete():
    impl = load_implementation("triton")
    assert impl.operations == OPERATIONS
    assert (impl.name, impl.rounding, impl.padded_rows, impl.checks_inputs) == ("triton", "single", "rotated", True)


def test_fake_tensors_trace_without_running_kernels():
    """Under FakeTensorMode the ops run their fakes: no data, no kernel launch, nothing returned."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        t, l, r = 3, 8, 8
        kv = torch.empty(t, l + r, dtype=torch.bfloat16, device=DEVICE)
        cache = torch.empty(2, 4, l + r, dtype=torch.uint8, device=DEVICE)
        result = torch.ops.mla_fuse.concat_and_cache_mla_rope_fused(
            torch.zeros(t, dtype=torch.int64, device=DEVICE), torch.empty(t, 2, r, dtype=torch.bfloat16, device=DEVICE),
            kv[:, l:], kv[:, :l], torch.empty(16, r, device=DEVICE), False,
            torch.zeros(t, dtype=torch.int64, device=DEVICE), cache, "fp8", torch.ones(1, device=DEVICE))
    assert result is None


def test_cpu_tensors_in_a_gpu_process_are_refused_by_name(monkeypatch):
    """Where the kernels run on the GPU (Triton backend ``gpu``), a CPU tensor gets a ValueError naming
    the argument and the backend switch, before any launch (Triton's own error names no argument),
    and nothing is written."""
    from mla_fuse import kernels

    monkeypatch.setattr(kernels, "BACKEND", "gpu")
    kv = torch.randn(2, 24).to(torch.bfloat16)
    cache = torch.full((2, 2, 24), 7, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"concat_and_cache_mla: argument 'kv_cache' is on the CPU.*"
                                         r"MLA_FUSE_TRITON_BACKEND=interpreter"):
        ops.concat_and_cache_mla(kv[:, :16], kv[:, 16:], cache, torch.tensor([0, 3]), "fp8",
                                 torch.tensor([1.0]))
    assert bool((cache == 7).all())
