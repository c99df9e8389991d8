"""Every repository path that a doc or a docstring names exists.

Where: README.md, every ``*.md`` under docs/ (docs/vllm-cpu/ included) and property_tests/README.md,
and the docstrings (module, class, function) of every tracked Python file. CHANGELOG.md is left out:
it is history, and names files as they were when each entry was written. Not read: comments, and the
data under tests/data/ (files as other runs wrote them).

What counts as a repository path: a token of path characters (letters, digits, ``_ . - /``; one
with a placeholder in it, ``< > * { } $ …`` or ``...``, is a pattern, not a path) that

* starts with a top folder of this repository followed by ``/`` (``docs/``, ``tests/``,
  ``mla_fuse/``, ...; ``mla_fuse_conformance/`` and ``mla_fuse_reference/`` are the installed
  names of ``property_tests/`` and ``reference/``), or with a subpackage of ``property_tests/`` or
  ``mla_fuse/`` followed by ``/`` (``commands/report/views.py``, ``kernels/launcher.py``: how the
  package's own docstrings name its modules); or
* in a docstring, is a bare module name, ``<name>.py`` with no ``/`` (how a module names its
  siblings): it must be the name of a tracked file (any folder), unless it is one of OTHER_FILES
  (files of other projects or of the user, and placeholders). The docs name our files by their path
  from the root and other projects' files bare (docs/THIRD_PARTY.md), so a bare name in a doc is
  not read.

A path resolves when it names a tracked file or a folder holding one, read from the repository's
root, from the package root for a subpackage path, and, in a docstring, from the docstring's own
folder. ``path:LINE``, ``path::test``, ``path#anchor`` and a trailing ``.`` or ``,`` are cut off
first; ``<module>.py.NAME`` and ``folder/<module>.NAME`` name an attribute of ``<module>.py``.
Paths of other projects (``vllm/...``, ``python/tutorials/...``) start with none of our folders and
are not read.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ("README.md", "property_tests/README.md")
DOCS_FOLDER = "docs/"
LEFT_OUT = ("CHANGELOG.md", "tests/data/")
# the installed package names of folders of this repository
INSTALLED = {"mla_fuse_conformance": "property_tests", "mla_fuse_reference": "reference"}
# the packages whose docstrings name their modules from the package's root (``commands/cli.py``)
PACKAGE_ROOTS = ("property_tests", "mla_fuse")
# bare module names that are no file of this repository, and whose they are
OTHER_FILES = {
    "_hypothesis_pytestplugin.py": "hypothesis' pytest plugin (docs/STYLE.md)",
    "my_adapter.py": "the user's adapter in the examples",
    "my_kernels.py": "the user's kernel package in the examples",
    "conftest.py": "pytest's per-folder file (the suite has none)",
    "setup.py": "a packaging file of other projects",
    "file.py": "the placeholder of a test's file in a failing id (``file.py::test[params]``)",
    "concat_and_cache_mla.py": "FlagGems' kernel file (adapters/flaggems.py)",
    "reshape_and_cache_flash.py": "FlagGems' kernel file (adapters/flaggems.py)",
    "patch_vllm_all.py": "FlagGems' patch of vLLM (adapters/flaggems.py)",
    "rotary.py": "flash-attn's Triton rotary and its layer (adapters/flash_attn_rotary.py)",
    "generation.py": "flash-attn's generation utilities (adapters/flash_attn_rotary.py)",
    "mla_buffer.py": "SGLang's MLA cache write kernels (adapters/sglang_triton.py)",
    "fused_qk_rope_reshape_and_cache.py": "SGLang's fused rope + cache write (adapters/sglang_triton.py)",
    "memory_pool.py": "SGLang's KV pools (adapters/sglang_triton.py)",
    "radix_attention.py": "SGLang's attention layer (adapters/sglang_triton.py)",
    "fill_kv_cache.py": "LMDeploy's paged cache write kernels (adapters/lmdeploy.py)",
    "messages.py": "LMDeploy's QuantPolicy and engine configs (adapters/lmdeploy.py)",
    "fill_graph_common_inputs.py": "LMDeploy's CUDA-graph input padding (adapters/lmdeploy.py)",
    "inputs_maker.py": "LMDeploy's step inputs (adapters/lmdeploy.py)",
    "model_inputs.py": "LMDeploy's step context (adapters/lmdeploy.py)",
    "turbo_quant.py": "LMDeploy's TurboQuant helpers (adapters/lmdeploy.py)",
    "default.py": "LMDeploy's default Triton attention backend (adapters/lmdeploy.py)",
    "apply_rotary_pos_emb.py": "LMDeploy's Triton rope (adapters/lmdeploy.py)",
}
TOKEN = re.compile(r"[\w.\-/<>*{}$…]+")
PLACEHOLDER = re.compile(r"[<>*{}$…]|\.\.\.")


def tracked_files(root: pathlib.Path) -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()


def texts(root: pathlib.Path, files: list[str]):
    """(file, line, text) of every doc and docstring read (module docstring)."""
    for name in files:
        if name.startswith(LEFT_OUT):
            continue
        if name in DOCS or (name.startswith(DOCS_FOLDER) and name.endswith(".md")):
            yield name, 1, (root / name).read_text()
        elif name.endswith(".py"):
            tree = ast.parse((root / name).read_text(), filename=name)
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    docstring = ast.get_docstring(node, clean=False)
                    if docstring:
                        yield name, getattr(node, "lineno", 1), docstring


def cited_path(token: str, top: set[str], subpackages: set[str], bare: bool) -> str | None:
    """The repository path a token names (cut to the path itself), or None when it names none;
    ``bare``: whether a bare module name counts (in a docstring)."""
    if PLACEHOLDER.search(token):
        return None
    path = re.split(r"::|#|:", token)[0].rstrip(".,")
    if ".py." in path:  # module.py.NAME: an attribute of the module
        path = path.partition(".py.")[0] + ".py"
    first, slash, _ = path.partition("/")
    if slash and (first in top or first in INSTALLED or first in subpackages):
        return path
    if bare and not slash and path.endswith(".py") and len(path) > 3 and path not in OTHER_FILES:
        return path
    return None


def resolves(path: str, citing: str, tracked: set[str], folders: set[str], names: set[str]) -> bool:
    if "/" not in path:
        return path in names
    first, _, rest = path.partition("/")
    candidates = [path, f"{INSTALLED[first]}/{rest}" if first in INSTALLED else path]
    candidates += [f"{package}/{path}" for package in PACKAGE_ROOTS]
    if citing.endswith(".py"):
        candidates.append(str(pathlib.PurePosixPath(citing).parent / path))
    stem, dot, _ = path.rpartition(".")  # folder/module.NAME: an attribute of folder/module.py
    if dot and "/" not in path[len(stem):]:
        candidates += [f"{candidate[:len(candidate) - len(path)]}{stem}.py" for candidate in candidates]
    return any(candidate.rstrip("/") in tracked or candidate.rstrip("/") in folders for candidate in candidates)


def missing_paths(root: pathlib.Path) -> list[str]:
    """``file:line: path`` for every path a doc or docstring names that does not exist."""
    files = tracked_files(root)
    tracked = set(files)
    folders = {str(parent) for name in files for parent in pathlib.PurePosixPath(name).parents}
    names = {pathlib.PurePosixPath(name).name for name in files}
    top = {name.split("/")[0] for name in files if "/" in name}
    subpackages = {name.split("/")[1] for name in files if name.startswith(tuple(f"{p}/" for p in PACKAGE_ROOTS))
                   and name.count("/") >= 2}
    missing = []
    for citing, line, text in texts(root, files):
        for token in TOKEN.findall(text):
            path = cited_path(token, top, subpackages, bare=citing.endswith(".py"))
            if path is not None and not resolves(path, citing, tracked, folders, names):
                missing.append(f"{citing}:{line}: {path}")
    return sorted(set(missing))


def test_every_path_named_in_the_docs_and_docstrings_exists():
    missing = missing_paths(ROOT)
    assert not missing, "paths named that do not exist:\n" + "\n".join(missing)


def _repository(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    return root


def test_the_check_sees_a_path_that_does_not_exist(tmp_path):
    """A planted repository: a doc naming a missing test file and a missing doc, a docstring naming a
    missing sibling module and a missing package-relative module are reported; the paths that exist
    (from the root, the package root or the docstring's folder, an attribute of a module), the
    patterns, other projects' paths, bare names in a doc and OTHER_FILES are not."""
    good_doc = ("See `tests/test_a.py::test_x` (tests/test_a.py:3), docs/B.md#part, `commands/report/`, "
                "`cases/sizes.limits`, `mla_fuse_conformance/commands/report/html.py`.\n"
                "Not paths: `docs/vllm-cpu/<impl>/report.json`, vllm/csrc/cpu/cache.cpp, `my_adapter.py`, "
                "REPORT_DIR/report.json, R/2, `triton_attn.py`.\n")
    good_module = '"""Written by ``html.py`` (``commands/report/html.py:12``, ``cases/sizes.py.limits``)."""\n'
    files = {"docs/A.md": good_doc, "docs/B.md": "", "tests/test_a.py": "", "property_tests/cases/sizes.py": "",
             "property_tests/commands/report/views.py": good_module, "property_tests/commands/report/html.py": ""}
    assert missing_paths(_repository(tmp_path, files)) == []
    files["docs/A.md"] += "Gone: `tests/test_no_such_file.py::test_x` and docs/NOWHERE.md.\n"
    files["property_tests/commands/report/views.py"] = (
        '"""Written by ``report_html.py`` (``commands/report/nowhere.py:12``); ``html.py``."""\n')
    assert missing_paths(_repository(tmp_path, files)) == [
        "docs/A.md:1: docs/NOWHERE.md", "docs/A.md:1: tests/test_no_such_file.py",
        "property_tests/commands/report/views.py:1: commands/report/nowhere.py",
        "property_tests/commands/report/views.py:1: report_html.py"]
