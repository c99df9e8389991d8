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


def imports_of(path: pathlib.Path, package: str, dynamic: bool = True) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved, and with ``dynamic``
    the literal names given to ``importlib.import_module``)."""
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
        elif (dynamic and isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
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


# ---------------------------------------------------------------- the suite laid out by role (docs/DESIGN.md)

SUITE = "mla_fuse_conformance"
# The suite's subpackages and loose modules, lowest layer first. A module may import its own
# subpackage and any lower layer, at module level or inside a function (importlib strings are
# exempt: adapters and mutants are loaded by spec). A new subpackage must be placed here.
SUITE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("declarations",),  # the contract's operations and dtypes, the property modules: imports nothing
    ("settings",),  # hypothesis profiles, the example database
    ("cases",),  # case types, feature axes, strategies, tensors and sentinel memory, corruptions, engine caches
    ("contract",),  # capabilities, loading an implementation by spec
    ("judging",),  # the oracle, the CONTRACT §5 comparisons
    ("running",),  # harness (PropertyRun), recording, executor, replay, devices
    ("compile_passes",),  # the compile-pass kit: cases, models, layers, checks, opcheck, broken passes
    ("properties", "mutants", "adapters"),  # the leaves: none imports another
    ("commands",),  # the mla-fuse commands, one room each (COMMAND_ROOMS)
    ("plugin", "hookspecs", "__main__", "__init__"),  # loose modules at the top
)
LEAVES = {"properties", "mutants", "adapters"}
LAYER = {name: rank for rank, names in enumerate(SUITE_LAYERS) for name in names}
# Imports against the layers that cannot be fixed in this worktree today: (importer, imported) -> reason.
KNOWN_UPWARD_IMPORTS: dict[tuple[str, str], str] = {}
MAX_LINES = 400  # a module that grows past this is split by what it holds (no exceptions; the suite and mla_fuse)
# The compile-pass work lives in one subpackage, not behind a ``pass_`` prefix elsewhere.
COMPILE_PASS_MODULES = {"cases", "models", "layers", "inspection", "checks", "opcheck", "mutants"}


def suite_modules() -> dict[str, pathlib.Path]:
    """Path relative to property_tests/ (``cases/types.py``) -> path, for every module of the suite."""
    root = PACKAGES[SUITE]
    return {path.relative_to(root).as_posix(): path for path in sorted(root.rglob("*.py"))}


def layer_of_path(relative: str) -> str:
    """``cases/types.py`` -> ``cases``; ``plugin.py`` -> ``plugin``."""
    first = relative.split("/")[0]
    return first.removesuffix(".py")


def layer_of_import(name: str) -> str | None:
    """``mla_fuse_conformance.cases.types.MlaCase`` -> ``cases``; None for the root package itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def layering_violations(modules: dict[str, pathlib.Path]) -> dict[tuple[str, str], str]:
    """(importer, imported) -> what is wrong, for every import of the suite against SUITE_LAYERS."""
    found = {}
    for relative, path in modules.items():
        here = layer_of_path(relative)
        for name in sorted(imports_of(path, SUITE, dynamic=False)):
            there = layer_of_import(name) if _top(name) == SUITE else None
            if there is None or there == here:
                continue
            if here not in LAYER or there not in LAYER:
                found[(relative, name)] = f"{here if here not in LAYER else there} is in no layer of SUITE_LAYERS"
            elif LAYER[there] > LAYER[here]:
                found[(relative, name)] = f"{here} (layer {LAYER[here]}) imports {there} (layer {LAYER[there]})"
            elif here in LEAVES and there in LEAVES:
                found[(relative, name)] = f"{here} imports {there}: properties, mutants and adapters import neither"
    return {key: why for key, why in found.items() if (key[0], _module_part(key[1])) not in KNOWN_UPWARD_IMPORTS}


def _module_part(name: str) -> str:
    """``mla_fuse_conformance.plugin.OUTCOMES_FILE`` -> ``mla_fuse_conformance.plugin`` (a loose module)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and not (PACKAGES[SUITE] / parts[1]).is_dir() else name


def test_every_suite_subpackage_and_loose_module_is_placed():
    placed = {layer_of_path(relative) for relative in suite_modules()}
    assert placed == set(LAYER), (f"not in SUITE_LAYERS: {sorted(placed - set(LAYER))}; "
                                  f"named there but absent: {sorted(set(LAYER) - placed)}")


def test_the_suite_imports_point_down_its_layers():
    violations = layering_violations(suite_modules())
    assert not violations, "\n".join(f"{importer} imports {name}: {why}"
                                     for (importer, name), why in sorted(violations.items()))


def test_known_upward_imports_still_exist():
    """An exception that is fixed must leave KNOWN_UPWARD_IMPORTS."""
    modules = suite_modules()
    for importer, imported in KNOWN_UPWARD_IMPORTS:
        names = {_module_part(name) for name in imports_of(modules[importer], SUITE, dynamic=False)}
        assert imported in names, f"{importer} no longer imports {imported}: remove it from KNOWN_UPWARD_IMPORTS"


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """A planted ``cases`` module importing ``running`` (and a leaf importing a leaf) is reported."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "mutants").mkdir()
    planted = tmp_path / "cases" / "planted.py"
    planted.write_text("def f():\n    from mla_fuse_conformance.running import harness\n")
    leaf = tmp_path / "mutants" / "planted.py"
    leaf.write_text("from mla_fuse_conformance.adapters import triton\n")
    dynamic = tmp_path / "cases" / "dynamic.py"
    dynamic.write_text("import importlib\nimportlib.import_module('mla_fuse_conformance.commands.cli')\n")
    original = PACKAGES[SUITE]
    PACKAGES[SUITE] = tmp_path  # imports_of resolves relative imports against the package root
    try:
        found = layering_violations({"cases/planted.py": planted, "mutants/planted.py": leaf,
                                     "cases/dynamic.py": dynamic})
    finally:
        PACKAGES[SUITE] = original
    assert set(found) == {("cases/planted.py", "mla_fuse_conformance.running"),
                          ("cases/planted.py", "mla_fuse_conformance.running.harness"),
                          ("mutants/planted.py", "mla_fuse_conformance.adapters"),
                          ("mutants/planted.py", "mla_fuse_conformance.adapters.triton")}


# commands/ by role: its rooms (a subpackage whose cli.py is the entry, or a loose module), lowest first.
# The same rule as SUITE_LAYERS one level down: a room imports its own modules and rooms below it; the
# rooms of one layer named in COMMAND_LEAVES import none of each other.
COMMAND_ROOMS: tuple[tuple[str, ...], ...] = (
    ("conformance_map",),  # cells per failing property, limit checks, baseline, cell identity
    ("repro",),  # mla-fuse repro, the standalone reproducer
    ("report",),  # report.json, report.html, summary.md, mla-fuse report
    ("progress",),  # the console's progress lines (also a pytest plugin in verify's child)
    ("compare", "adapter", "fuzz"),  # mla-fuse compare, adapter --template, fuzz and db
    ("verify",),  # mla-fuse verify: the properties, then the rooms above
    ("cli", "__init__"),  # the mla-fuse parser
)
COMMAND_LEAVES = {"compare", "adapter", "fuzz"}
COMMAND_RANK = {name: rank for rank, names in enumerate(COMMAND_ROOMS) for name in names}


def command_room_of_path(relative: str) -> str | None:
    """``commands/report/html.py`` -> ``report``; ``commands/cli.py`` -> ``cli``; None outside commands/."""
    parts = relative.split("/")
    return parts[1].removesuffix(".py") if parts[0] == "commands" and len(parts) > 1 else None


def command_room_of_import(name: str) -> str | None:
    """``mla_fuse_conformance.commands.report.html.write`` -> ``report``; None for commands itself."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == [SUITE, "commands"] else None


def command_room_violations(modules: dict[str, pathlib.Path]) -> dict[tuple[str, str], str]:
    """(importer, imported) -> what is wrong, for every import between rooms of commands/."""
    found = {}
    for relative, path in modules.items():
        here = command_room_of_path(relative)
        if here is None:
            continue
        for name in sorted(imports_of(path, SUITE, dynamic=False)):
            there = command_room_of_import(name)
            if there is None or there == here:
                continue
            if here not in COMMAND_RANK or there not in COMMAND_RANK:
                found[(relative, name)] = f"{here if here not in COMMAND_RANK else there} is in no room of COMMAND_ROOMS"
            elif COMMAND_RANK[there] > COMMAND_RANK[here]:
                found[(relative, name)] = (f"commands/{here} (room {COMMAND_RANK[here]}) imports commands/{there} "
                                           f"(room {COMMAND_RANK[there]})")
            elif here in COMMAND_LEAVES and there in COMMAND_LEAVES:
                found[(relative, name)] = f"commands/{here} imports commands/{there}: {sorted(COMMAND_LEAVES)} " \
                                          "import none of each other"
    return found


def test_every_command_room_is_placed_and_has_its_entry():
    modules = suite_modules()
    rooms = {room for relative in modules if (room := command_room_of_path(relative)) is not None}
    assert rooms == set(COMMAND_RANK), (f"not in COMMAND_ROOMS: {sorted(rooms - set(COMMAND_RANK))}; "
                                        f"named there but absent: {sorted(set(COMMAND_RANK) - rooms)}")
    packages = {relative.split("/")[1] for relative in modules if relative.count("/") == 2
                and relative.startswith("commands/")}
    without_entry = sorted(room for room in packages if f"commands/{room}/cli.py" not in modules)
    assert not without_entry, f"a room of commands/ is entered through its cli.py: {without_entry}"


def test_the_command_rooms_import_down():
    violations = command_room_violations(suite_modules())
    assert not violations, "\n".join(f"{importer} imports {name}: {why}"
                                     for (importer, name), why in sorted(violations.items()))


def test_the_room_check_sees_an_upward_import(tmp_path):
    """The map importing the report (its cycle before the split) and compare importing fuzz are reported."""
    for room in ("commands/conformance_map", "commands/compare"):
        (tmp_path / room).mkdir(parents=True)
    upward = tmp_path / "commands" / "conformance_map" / "planted.py"
    upward.write_text("def f():\n    from mla_fuse_conformance.commands.report.document import report\n")
    sideways = tmp_path / "commands" / "compare" / "planted.py"
    sideways.write_text("from mla_fuse_conformance.commands.fuzz import cli\n")
    original = PACKAGES[SUITE]
    PACKAGES[SUITE] = tmp_path
    try:
        found = command_room_violations({"commands/conformance_map/planted.py": upward,
                                         "commands/compare/planted.py": sideways})
    finally:
        PACKAGES[SUITE] = original
    assert set(found) == {
        ("commands/conformance_map/planted.py", "mla_fuse_conformance.commands.report.document"),
        ("commands/conformance_map/planted.py", "mla_fuse_conformance.commands.report.document.report"),
        ("commands/compare/planted.py", "mla_fuse_conformance.commands.fuzz"),
        ("commands/compare/planted.py", "mla_fuse_conformance.commands.fuzz.cli")}


def test_declared_property_modules_are_the_property_files():
    from mla_fuse_conformance.declarations import property_modules as declared

    listed = [*declared.KERNEL_PROPERTY_MODULES, *declared.COMPILE_PASS_MODULES, *declared.FIXED_CASE_MODULES]
    files = sorted(path.stem for path in (PACKAGES[SUITE] / "properties").glob("test_*.py"))
    assert sorted(listed) == files, "declare each properties/test_*.py once in declarations/property_modules.py"


def modules_over_the_line_limit(root: pathlib.Path) -> dict[str, int]:
    """Path relative to ``root`` -> lines, for every module under ``root`` longer than ``MAX_LINES``."""
    lengths = {path.relative_to(root).as_posix(): len(path.read_text().splitlines()) for path in root.rglob("*.py")}
    return {relative: n for relative, n in lengths.items() if n > MAX_LINES}


@pytest.mark.parametrize("package", ["mla_fuse_conformance", "mla_fuse"])
def test_every_module_fits_the_line_limit(package):
    """The suite's modules and the product's (docs/STYLE.md 14)."""
    too_long = modules_over_the_line_limit(PACKAGES[package])
    assert not too_long, f"split by what they hold (limit {MAX_LINES} lines): {too_long}"


def test_the_line_limit_sees_a_long_module(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert modules_over_the_line_limit(tmp_path) == {"sub/long.py": MAX_LINES + 1}


def compile_pass_misplacements(relatives) -> list[str]:
    """What is wrong with where the compile-pass modules are: a kit module missing from
    ``compile_passes/``, or a ``pass_*``/``passes`` module elsewhere in the suite."""
    present = {r.removeprefix("compile_passes/").removesuffix(".py") for r in relatives
               if r.startswith("compile_passes/")}
    missing = [f"compile_passes/{name}.py is missing" for name in sorted(COMPILE_PASS_MODULES - present)]
    stray = [f"{r} belongs in compile_passes/" for r in relatives if not r.startswith("compile_passes/")
             and pathlib.PurePosixPath(r).stem.startswith(("pass_", "passes"))]
    return missing + stray


def test_the_compile_pass_modules_live_in_compile_passes():
    assert not compile_pass_misplacements(suite_modules())


def test_the_compile_pass_check_sees_a_stray_module():
    kit = [f"compile_passes/{name}.py" for name in sorted(COMPILE_PASS_MODULES)]
    assert compile_pass_misplacements(kit + ["properties/test_compile_passes.py"]) == []
    assert compile_pass_misplacements(kit[1:] + ["cases/pass_models.py", "mutants/passes.py"]) == [
        f"{kit[0]} is missing", "cases/pass_models.py belongs in compile_passes/",
        "mutants/passes.py belongs in compile_passes/"]


# ---------------------------------------------------------------- module-level state (docs/STYLE.md item 12)

MUTATING_METHODS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault", "add",
                    "discard", "__setitem__"}
CONTAINER_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque"}


def _module_level_names(tree: ast.Module) -> dict[str, ast.AST]:
    names = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name):
                names[target.id] = node.value
    return names


def _is_mutable_container(value: ast.AST) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    func = value.func if isinstance(value, ast.Call) else None
    return func is not None and (getattr(func, "id", None) or getattr(func, "attr", None)) in CONTAINER_CALLS


def _suite_aliases(tree: ast.Module, path: pathlib.Path) -> dict[str, tuple[str, str | None]]:
    """Local name -> (suite module relative path, its attribute or None) for the suite modules imported."""
    modules = suite_modules()
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _top(node.module) == SUITE and not node.level:
            base = "/".join(node.module.split(".")[1:])
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{base}/{alias.name}.py" in modules:
                    aliases[local] = (f"{base}/{alias.name}.py", None)
                elif f"{base}.py" in modules:
                    aliases[local] = (f"{base}.py", alias.name)
    return aliases


def module_state(modules: dict[str, pathlib.Path]) -> set[tuple[str, str]]:
    """(module, name) of module-level names mutated after import, from inside a function anywhere in
    the suite (``global``, item or attribute assignment, a mutating method, rebinding through a
    module alias), and of module-level mutable containers whose name is not a CONSTANT."""
    trees = {relative: ast.parse(path.read_text(), filename=str(path)) for relative, path in modules.items()}
    top_level = {relative: _module_level_names(tree) for relative, tree in trees.items()}
    found = set()
    for relative, names in top_level.items():
        found |= {(relative, name) for name, value in names.items()
                  if _is_mutable_container(value) and not name.isupper() and not name.startswith("__")}
    for relative, tree in trees.items():
        aliases = _suite_aliases(tree, modules[relative])

        def owner(expr):
            """(module, name) a mutated expression belongs to, if it is module-level state of the suite."""
            if isinstance(expr, ast.Name):
                if expr.id in top_level[relative]:
                    return relative, expr.id
                if expr.id in aliases and aliases[expr.id][1] is not None:
                    return aliases[expr.id]
            if (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in aliases
                    and aliases[expr.value.id][1] is None):
                return aliases[expr.value.id][0], expr.attr
            return None

        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                mutated = []
                if isinstance(node, ast.Global):
                    found |= {(relative, name) for name in node.names}
                elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                    targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                    for target in targets:
                        if isinstance(target, (ast.Subscript, ast.Attribute)):
                            mutated.append(target.value)
                            if isinstance(target, ast.Attribute):
                                mutated.append(target)  # module.NAME = value
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr in MUTATING_METHODS):
                    mutated.append(node.func.value)
                found |= {key for expr in mutated if (key := owner(expr)) is not None and key[0] in top_level
                          and key[1] in top_level[key[0]]}
    return found


def test_no_module_state():
    """Run state lives in pytest's config.stash or in objects passed along (docs/STYLE.md item 12)."""
    found = module_state(suite_modules())
    assert not found, f"module-level state {sorted(found)}: keep it in config.stash or an object passed around"


def test_the_state_check_sees_state(tmp_path):
    module = tmp_path / "state.py"
    module.write_text("CACHE = {}\n_seen = []\nLIMITS = {'a': 1}\nFLAG = False\n"
                      "def remember(key):\n    CACHE[key] = 1\n\ndef switch():\n    global FLAG\n    FLAG = True\n")
    assert module_state({"state.py": module}) == {("state.py", "CACHE"), ("state.py", "_seen"), ("state.py", "FLAG")}
