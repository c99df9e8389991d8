"""Two layers, imports one way (docs/DESIGN.md "Layout").

* The product, ``mla_fuse``, loads none of the suite, the reference, the tests or the test
  libraries: checked on ``sys.modules`` in a fresh interpreter after importing every module of
  the package, so ``importlib`` and function-level imports count too.
* The reference, ``mla_fuse_reference``, loads nothing of ours.
* The suite, ``mla_fuse_conformance``, imports the product only through its public modules.
* No import circle inside any of the three packages (every import statement counts, at any
  depth, and ``importlib.import_module("literal")``).
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"mla_fuse": ROOT / "mla_fuse", "mla_fuse_conformance": ROOT / "property_tests",
            "mla_fuse_reference": ROOT / "reference"}
# What the suite may import of the product: the public modules (mla_fuse/__init__.py), and
# anything under the public packages layers/ and passes/.
PRODUCT_PUBLIC_MODULES = {"mla_fuse", "mla_fuse.ops", "mla_fuse.validation", "mla_fuse.compile", "mla_fuse.kernels"}
PRODUCT_PUBLIC_PACKAGES = ("mla_fuse.layers", "mla_fuse.passes")

LOADED_AFTER_IMPORTING_ALL = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_modules(package: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", LOADED_AFTER_IMPORTING_ALL, package], capture_output=True,
                            text=True, cwd=ROOT.parent, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("package, forbidden", [
    ("mla_fuse", {"mla_fuse_conformance", "mla_fuse_reference", "property_tests", "reference", "tests",
                  "hypothesis", "pytest", "_pytest"}),
    ("mla_fuse_reference", {"mla_fuse", "mla_fuse_conformance", "property_tests", "tests"}),
])
def test_importing_every_module_loads_nothing_forbidden(package, forbidden):
    offenders = sorted(name for name in loaded_modules(package) if _top(name) in forbidden)
    assert not offenders, f"importing every module of {package} loaded {offenders}"


def imports_of(path: pathlib.Path, package: str) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved, importlib literals)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    relative_to = path.relative_to(PACKAGES[package]).with_suffix("").parts
    here = [package, *relative_to]
    if here[-1] == "__init__":
        here = here[:-1]
    else:
        here = here[:-1]  # the package the module is in
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    root = PACKAGES[package]
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join([package, *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]]))
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        graph[name] = {target for target in imports_of(path, package) if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circle(package):
    graph = module_graph(package)
    # a package's __init__ importing its own submodules is not a circle through them
    for name in graph:
        graph[name] = {t for t in graph[name] if not (name.startswith(t + ".") and graph.get(t) is not None)}
    assert find_cycle(graph) is None, f"import circle in {package}: {' -> '.join(find_cycle(graph))}"


def _product_module(name: str, modules: set[str]) -> str:
    """The module a name imported from the product lives in (``mla_fuse.ops.x`` -> ``mla_fuse.ops``)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def test_the_suite_uses_only_the_public_api_of_the_product():
    product_modules = set(module_graph("mla_fuse"))
    offenders = {}
    for path in PACKAGES["mla_fuse_conformance"].rglob("*.py"):
        used = {_product_module(name, product_modules) for name in imports_of(path, "mla_fuse_conformance")
                if _top(name) == "mla_fuse"}
        private = sorted(module for module in used if module not in PRODUCT_PUBLIC_MODULES
                         and not module.startswith(PRODUCT_PUBLIC_PACKAGES))
        if private:
            offenders[str(path.relative_to(ROOT))] = private
    assert not offenders


def test_the_checks_can_fail():
    """The circle finder and the sys.modules check see what they are for."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert "mla_fuse_reference" in {_top(name) for name in loaded_modules("mla_fuse_conformance")}
