"""The implementation protocol and registry (--impl SPEC)."""

import sys
import types

import pytest

from mla_fuse_conformance.contract.implementation import OPERATIONS, describe, load_implementation


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
    assert impl.title == "outside_kernel:OutsideKernel (OutsideKernel)"


def test_a_name_that_begins_with_the_spec_is_the_title_alone():
    """The shipped adapters name themselves with their spec first (``liger (liger_kernel/...)``): the
    report's first line says it once, not ``liger (liger (...))``."""
    impl = describe(types.SimpleNamespace(name="liger (its rope file, interpreter)",
                                          rotary_embedding=lambda *args: None), "liger")
    assert impl.title == "liger (its rope file, interpreter)"
    assert describe(types.SimpleNamespace(name="ligerish", rotary_embedding=lambda *args: None), "liger").title == (
        "liger (ligerish)")


def test_env_var_is_the_fallback(monkeypatch):
    monkeypatch.setenv("MLA_FUSE_IMPL", "reference")
    assert load_implementation(None).name == "reference"


@pytest.mark.parametrize("spec, message", [
    ("no_such_name", "not a registered name"),
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


def test_a_misspelled_operation_is_named_and_a_required_one_fails(monkeypatch):
    from mla_fuse_conformance.running.harness import NotProvided, RequiredOperationMissing, property_named

    target = types.SimpleNamespace(concat_and_cache_mla=lambda *args: None,
                                   concat_and_cache_mla_rope_fuse=lambda *args: None)
    impl = describe(target, "x", require=("concat_and_cache_mla_rope_fused",))
    assert impl.near_misses == {"concat_and_cache_mla_rope_fuse": "concat_and_cache_mla_rope_fused"}
    assert impl.missing_required == ("concat_and_cache_mla_rope_fused",)
    prop = property_named("test_mla:test_fused_mla_matches_reference")
    with pytest.raises(RequiredOperationMissing, match="looks like 'concat_and_cache_mla_rope_fused'"):
        prop.check_provided(impl)
    with pytest.raises(NotProvided):
        prop.check_provided(describe(target, "x"))  # not required: skipped


@pytest.mark.parametrize("text, message", [("rotary", "not an operation"), ("rotary_embedding,,x", "x not")])
def test_require_names_only_operations(text, message):
    from mla_fuse_conformance.contract.implementation import ImplementationError, parse_required

    with pytest.raises(ImplementationError, match=message):
        parse_required(text)


def test_the_adapter_attribute_required_adds_to_the_option():
    target = types.SimpleNamespace(rotary_embedding=lambda *args: None, required=("concat_and_cache_mla",))
    assert describe(target, "x", require=("rotary_embedding",)).required == ("concat_and_cache_mla",
                                                                            "rotary_embedding")


def test_load_errors_are_one_line(tmp_path, monkeypatch):
    from mla_fuse_conformance.contract.implementation import ImplementationError

    (tmp_path / "fails_on_init.py").write_text("class K:\n    def __init__(self):\n        raise ImportError('lib "
                                               "missing\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplementationError) as error:
        load_implementation("fails_on_init:K")
    assert str(error.value) == "--impl=fails_on_init:K: K() failed: ImportError: lib missing"


# ---------------------------------------------------------------- errors name the option as the user gave it


@pytest.mark.parametrize("option, env, given", [
    ("--impl", None, "--impl=no_such_module_xyz:Impl: "),
    ("--mla-fuse-impl", None, "--mla-fuse-impl=no_such_module_xyz:Impl: "),
    ("--mla-fuse-impl", "no_such_module_xyz:Impl", "$MLA_FUSE_IMPL=no_such_module_xyz:Impl: "),
])
def test_load_errors_name_the_option_as_given(monkeypatch, option, env, given):
    from mla_fuse_conformance.contract.implementation import ImplementationError

    monkeypatch.delenv("MLA_FUSE_IMPL", raising=False)
    if env:
        monkeypatch.setenv("MLA_FUSE_IMPL", env)
    with pytest.raises(ImplementationError) as error:
        load_implementation(None if env else "no_such_module_xyz:Impl", option=option)
    assert str(error.value).startswith(given), str(error.value)


def test_require_errors_name_the_option_as_given():
    from mla_fuse_conformance.contract.implementation import ImplementationError, parse_required

    with pytest.raises(ImplementationError, match="^--mla-fuse-require: rotary not an operation"):
        parse_required("rotary", "--mla-fuse-require")
    with pytest.raises(ImplementationError, match=r"^implementation 'x': required: rotary not an operation"):
        describe(types.SimpleNamespace(rotary_embedding=lambda *args: None, required=("rotary",)), "x")


def test_the_plugin_loads_only_the_option_names_at_import():
    """The guest rule (plugin.py): importing the plugin, option names included, loads no torch,
    hypothesis or Triton and nothing of ours but the declared names."""
    import json
    import subprocess

    code = "import json, sys; import mla_fuse_conformance.plugin; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       timeout=300).stdout)
    ours = {name for name in loaded if name.split(".")[0] in ("torch", "hypothesis", "triton", "mla_fuse",
                                                              "mla_fuse_conformance", "mla_fuse_reference")}
    assert ours == {"mla_fuse_conformance", "mla_fuse_conformance.plugin", "mla_fuse_conformance.declarations",
                    "mla_fuse_conformance.declarations.options"}, ours
