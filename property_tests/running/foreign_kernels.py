"""Running Triton kernels other projects ship, from their source files, with the real Triton.

Shared by the adapters that verify a third party's Triton kernels (``adapters/vllm_triton.py``,
``adapters/flaggems.py``, ``adapters/liger.py``; adapters are leaves and import no other adapter, so
what they share lives here). What it has:

``load_jit_functions`` parses a kernel file with ``ast``, takes the named function definitions,
checks their decorators are exactly the ones expected, drops them (a ``triton.jit(...)``'s literal
keyword arguments, ``do_not_specialize``, are handed to the function built), and compiles those definitions
alone under the file's own name and line numbers, with globals the caller gives (the real
``triton`` and ``tl``, constants, helper namespaces). Each comes back built for the backend asked
for: an ``InterpretedFunction`` or a ``JITFunction``, what ``@triton.jit`` would have built. Triton
reads the source back through ``inspect`` from that file, so its errors point at the project's own
lines. Nothing of the project is imported; ``sys.modules`` and ``os.environ`` are not touched.
``source`` replaces the file's text (a planted kernel in the tests), registered with ``linecache``
under a name of its own, where Triton reads it back. ``load_functions`` compiles plain functions of
a file the same way (a project's launch wrapper, run as its project wrote it, with the kernel built
here handed in as a global). ``tests/test_own_kernels_loaded_as_foreign.py`` runs mla_fuse's own kernels
through both pieces (docs/THIRD_PARTY.md, "Our own kernels through the same path").

Under Triton's interpreter the artifacts of the interpreter itself (fp8 and bfloat16 conversions, bfloat16
arithmetic, comparison results) are corrected for every kernel of a run, these included:
``running/interpreter_corrections.py``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import linecache
import os
import pathlib

import triton
from triton.runtime.interpreter import InterpretedFunction


def load_jit_functions(path: pathlib.Path, decorated: dict[str, list[str]], namespace: dict, interpreted: bool,
                       source: str | None = None) -> dict:
    """Name -> the definition of that name in ``path`` built for the backend (module docstring).

    ``decorated`` maps each name to its expected decorators as written (``["triton.jit"]``); a definition
    missing, repeated or decorated otherwise raises ImportError naming the file, so a changed file is
    not launched differently from how its project launches it. ``namespace`` holds the globals the
    definitions see (copied; ``__name__`` is set to the file's name). In those globals each name then
    stands for its built function, as in the file's module after ``@triton.jit``: a definition calling
    another one loaded with it (a ``@jit`` helper of the same file) calls the built helper, which the
    interpreter rewrites and a GPU compiles, not the bare Python function."""
    scope = _compiled(path, decorated, namespace, source)
    options = {name: _jit_options(decorators) for name, decorators in decorated.items()}
    if interpreted:
        built = {name: InterpretedFunction(scope[name], **options[name]) for name in decorated}
    else:
        built = {name: triton.runtime.jit.JITFunction(scope[name], **options[name]) for name in decorated}
    scope.update(built)
    return built


def _jit_options(decorators: list[str]) -> dict:
    """The keyword arguments of a ``triton.jit(...)`` decorator as written (``do_not_specialize=('seq_len',)``),
    literals only: what ``@triton.jit(...)`` hands the ``JITFunction`` it builds; {} for a bare decorator."""
    calls = [ast.parse(decorator, mode="eval").body for decorator in decorators]
    calls = [call for call in calls if isinstance(call, ast.Call) and ast.unparse(call.func) == "triton.jit"]
    return {keyword.arg: ast.literal_eval(keyword.value) for call in calls for keyword in call.keywords}


def load_functions(path: pathlib.Path, names: tuple[str, ...], namespace: dict, source: str | None = None) -> dict:
    """Name -> the plain (undecorated) Python function of that name in ``path``, compiled together with
    the globals of ``namespace`` (a project's launch wrapper, run as written: its kernel is handed in
    through ``namespace``). A definition missing, repeated or decorated raises ImportError."""
    scope = _compiled(path, {name: [] for name in names}, namespace, source)
    return {name: scope[name] for name in names}


def _compiled(path: pathlib.Path, decorated: dict[str, list[str]], namespace: dict, source: str | None) -> dict:
    """The globals after compiling the named definitions of ``path`` alone (decorators checked, dropped)."""
    filename = str(path)
    if source is not None:
        filename = f"{path} (planted)"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    text = path.read_text() if source is None else source
    tree = ast.parse(text, filename=filename)
    nodes = []
    for name, decorators in decorated.items():
        found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
        if len(found) != 1:
            raise ImportError(f"{path}: expected one definition of {name}, found {len(found)}")
        written = [ast.unparse(decorator) for decorator in found[0].decorator_list]
        if written != decorators:
            raise ImportError(f"{path}: {name} is decorated {written}, not {decorators}: the adapter would launch "
                              "it differently from its project")
        found[0].decorator_list = []  # the line numbers stay the file's: inspect finds the definition there
        nodes.append(found[0])
    scope = {**namespace, "__name__": f"foreign_kernel:{path}"}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), filename, "exec"), scope)
    return scope


def module_constants(path: pathlib.Path, names: tuple[str, ...], namespace: dict) -> dict:
    """Name -> value of the module-level assignments ``NAME = tl.constexpr(<literal>)`` of ``path``
    (evaluated with ``namespace``); ImportError when one is missing or is not of that form."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in names):
            value = node.value
            if not (isinstance(value, ast.Call) and ast.unparse(value.func) == "tl.constexpr"
                    and all(isinstance(arg, ast.Constant) for arg in value.args)):
                raise ImportError(f"{path}: {node.targets[0].id} is not tl.constexpr(<literal>)")
            found[node.targets[0].id] = eval(compile(ast.Expression(value), str(path), "eval"), dict(namespace))
    missing = sorted(set(names) - set(found))
    if missing:
        raise ImportError(f"{path}: no module-level {missing}")
    return found


def find_package(name: str, env_var: str, marker: str, not_found: str, wheel: str) -> pathlib.Path:
    """A third party's package directory ``name``: ``$env_var/name`` (an unpacked wheel, checked to hold
    ``marker``, a file of it the adapter reads), else the installed one (``find_spec``: nothing imported)."""
    root = os.environ.get(env_var)
    if root:
        path = pathlib.Path(root) / name
        if not (path / marker).is_file():
            raise ImportError(f"{env_var}={root}: no {name}/{marker} there (point it at the directory "
                              f"an unpacked {wheel} wheel was unzipped into)")
        return path
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(not_found)
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def package_version(package: pathlib.Path) -> str | None:
    """``"DISTRIBUTION VERSION"`` from the dist-info beside ``package`` (the one whose top level it is), or None."""
    for distribution in importlib.metadata.distributions(path=[str(package.parent)]):
        if (distribution.read_text("top_level.txt") or "").split() == [package.name]:
            return f"{distribution.metadata['Name']} {distribution.version}"
    return None
