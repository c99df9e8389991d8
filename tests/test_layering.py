"""Imports point one way (docs/DESIGN.md): reference/ never imports mla_fuse, and mla_fuse/ never
imports reference/ or the suites."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def imported_top_level_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package, forbidden", [
    ("reference", {"mla_fuse", "tests", "property_tests"}),
    ("mla_fuse", {"reference", "tests", "property_tests"}),
])
def test_imports_point_one_way(package, forbidden):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    offenders = {str(f.relative_to(ROOT)): sorted(imported_top_level_modules(f) & forbidden) for f in files}
    assert not {f: bad for f, bad in offenders.items() if bad}
