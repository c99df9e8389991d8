"""The implementation protocol and registry (--impl SPEC)."""

import sys
import types

import pytest

from mla_fuse_conformance.implementation import OPERATIONS, describe, load_implementation


def test_reference_is_registered_and_complete():
    impl = load_implementation("reference")
    assert impl.name == "reference" and impl.operations == OPERATIONS
    assert (impl.rounding, impl.padded_rows, impl.checks_inputs) == ("single", "rotated", False)


def test_module_attr_spec_instantiates_classes_and_reads_defaults(monkeypatch):
    module = types.ModuleType("outside_kernel")

    class OutsideKernel:  # provides one operation, declares nothing
        def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
            pass

    module.OutsideKernel = OutsideKernel
    monkeypatch.setitem(sys.modules, "outside_kernel", module)
    impl = load_implementation("outside_kernel:OutsideKernel")
    assert impl.operations == ("concat_and_cache_mla",)
    assert not impl.provides("rotary_embedding")
    assert (impl.name, impl.rounding, impl.padded_rows, impl.checks_inputs) == (
        "OutsideKernel", "single", "rotated", False)


def test_env_var_is_the_fallback(monkeypatch):
    monkeypatch.setenv("MLA_FUSE_IMPL", "reference")
    assert load_implementation(None).name == "reference"


@pytest.mark.parametrize("spec, message", [
    ("no_such_name", "neither a registered name"),
    ("no_such_module_xyz:Impl", "cannot import module"),
    ("mla_fuse_reference.adapter:Missing", "has no attribute"),
])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        load_implementation(spec)


@pytest.mark.parametrize("attribute, value", [("rounding", "sloppy"), ("padded_rows", "sometimes")])
def test_bad_declarations_are_rejected(attribute, value):
    target = types.SimpleNamespace(rotary_embedding=lambda *args: None, **{attribute: value})
    with pytest.raises(ValueError, match=attribute):
        describe(target)


def test_an_object_without_operations_is_rejected():
    with pytest.raises(ValueError, match="provides none"):
        describe(types.SimpleNamespace(name="empty"))
