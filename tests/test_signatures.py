"""Each operation is declared once (``mla_fuse.signatures``) and everything that depends on its
signature is derived: the op's schema and registration, its fake, the version bumps, the overlap
check, the same-device check and the public wrapper's argument-type checks.

The acceptance test plants a parameter in a declaration (a copy of ``concat_and_cache_mla``'s
with one more tensor), registers it in a namespace of its own with ``ops.register`` and sees the
new parameter reach the schema, the fake, the kernel's version bumps, the overlap check and the
wrapper's checks, with no other edit. Planted and seen failing: the fake, the overlap check and
the wrapper's checks each written out with the declared parameters of today (the planted one
missing), as they were before the declarations.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from mla_fuse import ops, signatures, validation
from mla_fuse.signatures import Parameter, Tensor, written

_LIBRARY = torch.library.Library("mla_fuse_planted", "DEF")  # lives as long as the test process


def _planted(operation: signatures.Operation, parameter: Parameter, name: str) -> signatures.Operation:
    """``operation`` with ``parameter`` added last, under another name."""
    return dataclasses.replace(operation, name=name, parameters=(*operation.parameters, parameter))


RECORDED: list[tuple] = []  # the planted ops' kernel calls
WRITTEN = _planted(signatures.CONCAT_AND_CACHE_MLA, written("planted"), "written_planted")
READ = _planted(signatures.CONCAT_AND_CACHE_MLA, Parameter("planted", Tensor), "read_planted")
ENTRY_POINTS = {operation.name: ops.register(_LIBRARY, operation, RECORDED.append).default
                for operation in (WRITTEN, READ)}


def _arguments(planted: torch.Tensor | None = None) -> list:
    """Valid ``concat_and_cache_mla`` arguments (L = 8, R = 4, 3 tokens, bf16 cache) and the planted tensor."""
    kv = torch.randn(3, 12).bfloat16()
    cache = torch.zeros(2, 4, 12, dtype=torch.bfloat16)
    planted = torch.zeros(3, 5) if planted is None else planted
    return [kv[:, :8], kv[:, 8:], cache, torch.tensor([0, 5, -1]), "auto", torch.ones(1), planted]


@pytest.mark.parametrize("operation, schema", [
    (WRITTEN, "Tensor(a6!) planted) -> ()"),
    (READ, "Tensor planted) -> ()"),
])
def test_a_planted_parameter_reaches_the_schema(operation, schema):
    assert str(ENTRY_POINTS[operation.name]._schema).endswith(schema)


@pytest.mark.parametrize("operation", [WRITTEN, READ], ids=lambda operation: operation.name)
def test_a_planted_parameter_reaches_the_fake(operation):
    """The fake is the Meta kernel: a call whose planted tensor alone is on ``meta`` dispatches to it,
    and it names the planted argument; with every tensor on ``meta`` it passes."""
    arguments = _arguments(torch.zeros(3, 5, device="meta"))
    with pytest.raises(ValueError, match="'planted' is on meta but 'kv_c' is on cpu"):
        ENTRY_POINTS[operation.name](*arguments)
    on_meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in arguments]
    ENTRY_POINTS[operation.name](*on_meta)


def test_a_planted_written_parameter_reaches_the_kernel_and_its_version_bump():
    arguments = _arguments()
    before = arguments[-1]._version
    RECORDED.clear()
    ENTRY_POINTS[WRITTEN.name](*arguments)
    assert len(RECORDED) == 1 and RECORDED[0][-1] is arguments[-1]
    assert arguments[-1]._version > before
    before = arguments[-1]._version
    ENTRY_POINTS[READ.name](*arguments)
    assert arguments[-1]._version == before  # read only: no bump


def test_a_planted_parameter_reaches_the_overlap_check():
    """Written: the planted tensor may not overlap a read one; read: a written one may not overlap it."""
    arguments = _arguments()
    arguments[-1] = arguments[0][:, :5]  # planted: a view of kv_c
    with pytest.raises(ValueError, match="arguments 'planted' .* and 'kv_c' .* overlap in memory"):
        validation.overlap_check(WRITTEN)(*arguments)
    validation.overlap_check(READ)(*arguments)  # two read arguments may share memory
    arguments[-1] = arguments[2][0, :3, :5]  # planted: a view of kv_cache
    with pytest.raises(ValueError, match="arguments 'kv_cache' .* and 'planted' .* overlap in memory"):
        validation.overlap_check(READ)(*arguments)


def test_a_planted_parameter_reaches_the_same_device_check():
    arguments = _arguments(torch.zeros(3, 5, device="meta"))
    with pytest.raises(ValueError, match="'planted' is on meta"):
        validation.same_device_check(READ)(*arguments)


@pytest.mark.parametrize("operation", [WRITTEN, READ], ids=lambda operation: operation.name)
def test_a_planted_parameter_reaches_the_wrappers_checks(operation):
    """The wrapper's argument-type check, derived from the schema, names the planted argument."""
    call = ops.checked_call(ENTRY_POINTS[operation.name])
    arguments = _arguments()
    arguments[-1] = [0.0] * 5
    with pytest.raises(TypeError, match=f"{operation.name}: argument 'planted' must be a torch.Tensor, got list"):
        call(tuple(arguments), None)
    RECORDED.clear()
    call(tuple(_arguments()), None)
    assert len(RECORDED) == 1


# ---------------------------------------------------------------- the declarations and the product's tables


@pytest.mark.parametrize("operation", signatures.OPERATIONS, ids=lambda operation: operation.name)
def test_the_declarations_are_what_the_product_registers(operation):
    """The registered schema, the public wrapper and the checker take the declared parameters."""
    schema = getattr(torch.ops.mla_fuse, operation.name).default._schema
    assert tuple(argument.name for argument in schema.arguments) == operation.names
    assert tuple(argument.name for argument in schema.arguments
                 if argument.alias_info is not None and argument.alias_info.is_write) == operation.written
    wrapper = getattr(ops, operation.name)
    assert tuple(inspect.signature(wrapper).parameters)[:-1] == operation.names
    assert wrapper.custom_op is getattr(torch.ops.mla_fuse, operation.name)
    assert operation.kernel_device in operation.written


def test_the_tables_keyed_by_operation_name_exactly_the_declared_ones():
    """docs/STYLE.md 14: tables written out, each naming exactly the declared operations."""
    declared = [operation.name for operation in signatures.OPERATIONS]
    assert list(validation.CHECKERS) == declared
    assert list(ops._KERNELS) == declared
    assert list(ops._ENTRY_POINTS) == declared
    assert list(ops._CHECKED_CALLS) == declared


def test_a_wrapper_that_drifts_from_its_declaration_is_refused_at_import():
    def rotary_embedding(positions, query, key, head_size, cos_sin_cache, *, check_values=None):
        """is_neox forgotten"""

    with pytest.raises(TypeError, match="does not take the declared parameters"):
        ops._public(rotary_embedding)
