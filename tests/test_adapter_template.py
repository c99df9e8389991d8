"""``mla-fuse adapter --template``: the skeleton imports, loads, passes the signature check, and,
its bodies replaced by calls to ``mla_fuse.ops``, passes an example of a property."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from mla_fuse_conformance.cases.types import RopeCase, TableSpec
from mla_fuse_conformance.commands.cli import main
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS, OPERATIONS
from mla_fuse_conformance.running.harness import property_named

BODY = 'raise NotImplementedError("call your kernel here")'
ROPE_PROPERTY = "test_rotary_embedding:test_rotary_embedding_matches_reference"
RANK3 = RopeCase(seed=1, tokens=3, heads=2, kv_heads=1, head_size=6, dtype="bfloat16", is_neox=False,
                 table=TableSpec("plain", 4, 8))


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_full_template_loads_with_the_contracts_signatures(user_dir):
    assert main(["adapter", "--template", "--out", "team_kernels.py", "--name", "team-kernels"]) == 0
    text = (user_dir / "team_kernels.py").read_text()
    impl = load_implementation("team_kernels:TeamKernels")
    assert impl.operations == OPERATIONS and impl.unchecked == () and impl.name == "team-kernels"
    assert (impl.rounding, impl.padded_rows, impl.checks_inputs, impl.required) == ("single", "rotated", False, ())
    for operation, arguments in OPERATION_ARGUMENTS.items():
        assert f"def {operation}(self, " in text
        docstring = text.split(f"def {operation}(")[1].split('"""')[1]
        assert all(re.search(rf"^\s+{argument}\s+\S", docstring, re.M) for argument in arguments), operation
    with pytest.raises(NotImplementedError, match="call your kernel here"):
        impl.op("concat_and_cache_mla")(*OPERATION_ARGUMENTS["concat_and_cache_mla"])


def test_an_existing_file_is_not_overwritten(user_dir, capsys):
    (user_dir / "mine.py").write_text("# theirs\n")
    assert main(["adapter", "--template", "--out", "mine.py"]) == 2
    assert (user_dir / "mine.py").read_text() == "# theirs\n"
    assert "mine.py exists; not overwritten" in capsys.readouterr().err


def test_the_template_goes_to_stdout_with_the_chosen_operations(capsys):
    assert main(["adapter", "--template", "--op", "rope_and_reshape_and_cache_flash", "--op", "rotary_embedding"]) == 0
    text = capsys.readouterr().out
    assert re.findall(r"    def (\w+)\(", text) == ["rotary_embedding", "rope_and_reshape_and_cache_flash"]
    assert "class MyKernels:" in text and text.count(BODY) == 2


def _filled(text: str) -> str:
    """The template with each body calling ``mla_fuse.ops`` (what a team does with its kernel)."""
    for operation, arguments in OPERATION_ARGUMENTS.items():
        text = re.sub(rf"(def {operation}\(.*?){re.escape(BODY)}",
                      lambda match: match.group(1) + f"ops.{operation}({', '.join(arguments)})", text, flags=re.S)
    return "from mla_fuse import ops\n" + text


def test_the_filled_template_passes_an_example_of_a_property(user_dir):
    assert main(["adapter", "--template", "--op", "rotary_embedding", "--out", "stub_kernels.py"]) == 0
    prop = property_named(ROPE_PROPERTY)
    with pytest.raises(NotImplementedError):
        prop.run(load_implementation("stub_kernels:MyKernels"), torch.device("cpu"), RANK3)
    (user_dir / "filled_kernels.py").write_text(_filled((user_dir / "stub_kernels.py").read_text()))
    importlib.invalidate_caches()
    filled = load_implementation("filled_kernels:MyKernels")
    prop.run(filled, torch.device("cpu"), RANK3)  # raises on a failing example
    wrong_style = _filled((user_dir / "stub_kernels.py").read_text()).replace(", is_neox)\n", ", not is_neox)\n")
    (user_dir / "wrong_style_kernels.py").write_text(wrong_style)
    importlib.invalidate_caches()
    with pytest.raises(AssertionError):
        prop.run(load_implementation("wrong_style_kernels:MyKernels"), torch.device("cpu"), RANK3)
