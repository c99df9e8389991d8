"""Loading an adapter: a wrong signature fails at load with one line, and a SPEC that names no
implementation says what the user may have meant (contract/signatures.py, contract/suggestions.py)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import types

import pytest

from mla_fuse_conformance.contract.implementation import (BUILT_IN, ImplementationError, Implementation, describe,
                                                          load_implementation, registered_names)

CONTRACT_CALL = "the contract calls concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)"


class NoScale:
    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype):
        raise AssertionError("never called")


class ExtraStream:
    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, stream):
        raise AssertionError("never called")


class KeywordOnlyStream:
    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *, stream):
        raise AssertionError("never called")


@pytest.mark.parametrize("cls, problem", [
    (NoScale, "(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype) has no parameter for the contract's 'scale'"),
    (ExtraStream, "(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, stream) requires 'stream', which "
                  "the contract does not pass"),
    (KeywordOnlyStream, "requires 'stream', which the contract does not pass"),
])
def test_a_wrong_signature_fails_at_load_in_one_line(cls, problem):
    with pytest.raises(ImplementationError) as error:
        describe(cls(), "team:Kernels")
    message = str(error.value)
    assert message.startswith(f"implementation 'team:Kernels': {cls.__name__}.concat_and_cache_mla"), message
    assert problem in message and message.endswith(CONTRACT_CALL) and "\n" not in message, message


class Flexible:
    def concat_and_cache_mla(self, kv_c, k_pe, *rest, stream=None):
        pass

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox=True, extra=None):
        pass


def test_signatures_that_take_the_contracts_arguments_pass():
    impl = describe(Flexible(), "x")
    assert impl.operations == ("rotary_embedding", "concat_and_cache_mla") and impl.unchecked == ()


def test_an_unreadable_signature_is_accepted_and_listed():
    import torch

    builtin = torch._C._nn.gelu  # a C builtin: inspect.signature raises ValueError
    impl = describe(types.SimpleNamespace(concat_and_cache_mla=builtin, rotary_embedding=lambda *args: None), "x")
    assert impl.unchecked == ("concat_and_cache_mla",)


def _instance(spec: str):
    """The implementation object of a registered name; an adapter whose library is missing here
    (flashinfer, sglang: CUDA only) is made without running its ``__init__``."""
    module, _, attr = (BUILT_IN.get(spec) or spec).partition(":")
    cls = getattr(importlib.import_module(module), attr)
    try:
        return cls()
    except ImportError:
        return object.__new__(cls)


def test_every_registered_implementation_passes_the_signature_check():
    from mla_fuse_conformance.contract.implementation import _mutant_specs

    specs = {**BUILT_IN, **_mutant_specs()}
    assert len(specs) == len(registered_names()) > 10
    for name, spec in specs.items():
        assert isinstance(describe(_instance(spec), name), Implementation)


# ---------------------------------------------------------------- a SPEC that names no implementation

ADAPTER = '''
class MyKernels:
    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        pass

class Helper:  # provides no operation
    pass

INSTANCE = MyKernels()
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "team_adapter.py").write_text(ADAPTER)
    (tmp_path / "team_helpers.py").write_text("class Helper:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _message(spec: str) -> str:
    with pytest.raises(ImplementationError) as error:
        load_implementation(spec)
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize("spec, expected", [
    ("team_adapter", "--impl=team_adapter: 'team_adapter' is a module, not an implementation; did you mean "
                     "team_adapter:INSTANCE or team_adapter:MyKernels?"),
    ("team_adapter:MyKernel", "--impl=team_adapter:MyKernel: module 'team_adapter' has no attribute 'MyKernel'; "
                              "did you mean team_adapter:MyKernels or team_adapter:INSTANCE?"),
    ("team_adapter.py", "--impl=team_adapter.py: 'team_adapter.py' is a module, not an implementation; did you "
                        "mean team_adapter:INSTANCE or team_adapter:MyKernels?"),
    ("team_helpers", "--impl=team_helpers: 'team_helpers' is a module, not an implementation; it holds no class "
                     "or object with an operation of the contract"),
    ("mutant:sin_sign_flip", "--impl=mutant:sin_sign_flip: no mutant of that name; did you mean "
                             "mutant:sin_sign_flipped"),
])
def test_a_module_or_near_miss_suggests_what_was_meant(user_dir, spec, expected):
    assert _message(spec).startswith(expected), _message(spec)


def test_an_unknown_name_suggests_the_closest_and_counts_the_mutants():
    message = _message("triton-fast")
    mutants = [name for name in registered_names() if name.startswith("mutant:")]
    assert message.startswith("--impl=triton-fast: not a registered name; did you mean triton-cpu-fast"), message
    assert "? Registered: flaggems, flash-attn-rotary, flashinfer, liger, lmdeploy, reference," in message, message
    assert f"mutant:NAME ({len(mutants)} deliberately buggy implementations)" in message
    assert not any(name in message for name in mutants) and len(message) < 400, message
    assert _message("zzzz").startswith("--impl=zzzz: not a registered name. Registered: flaggems, flash-attn-rotary, "
                                       "flashinfer, liger,")


# ---------------------------------------------------------------- as a user runs it

NO_SCALE_ADAPTER = '''
class MyKernels:
    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype):
        raise AssertionError("never called")
'''


@pytest.mark.parametrize("command, status, option", [
    (["-m", "mla_fuse_conformance", "verify", "--impl", "my_adapter:MyKernels"], 2, "--impl"),
    (["-m", "pytest", "--pyargs", "mla_fuse_conformance", "--mla-fuse-impl=my_adapter:MyKernels", "-p",
      "no:cacheprovider"], 4, "--mla-fuse-impl"),
])
def test_a_user_with_a_wrong_signature_gets_one_line_and_stops(tmp_path, command, status, option):
    (tmp_path / "my_adapter.py").write_text(textwrap.dedent(NO_SCALE_ADAPTER))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "MLA_FUSE_"))}
    result = subprocess.run([sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    lines = [line for line in result.stderr.splitlines() if "concat_and_cache_mla" in line]
    assert result.returncode == status and len(lines) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"{option}=my_adapter:MyKernels: MyKernels.concat_and_cache_mla(" in lines[0], lines
    assert "has no parameter for the contract's 'scale'" in lines[0] and lines[0].endswith(CONTRACT_CALL), lines
