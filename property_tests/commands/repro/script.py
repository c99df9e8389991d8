"""Standalone reproducers: per failing cell of report.json, a script that needs only torch and the
kernel's own package (docs/REPORT.md, ``cells[].reproducer``).

``write_reproducers(report_dir, report)`` reads each cell's failure file (``replay.file``), rebuilds
the case's tensors (``cases/tensors.py``) and writes ``reproducers/<cell>.py``: one ``TENSORS`` table
of the inputs of the one operation the cell's property checks, as raw bits (literals, or
``<cell>.pt`` beside it when a buffer holds more than ``LITERAL_ELEMENTS``), each argument rebuilt
as the same view (storage offset, sizes, strides, and the buffer's start alignment mod 64) of a
buffer lying between guard bytes, the kernel call, and the operation's formula written out in
float64 (``formulas.py``). The kernel call is the adapter's ``call_source[operation]``
(the import lines and the call, in CONTRACT §4's argument names); an adapter without one is imported
from its module path and its method called. Each script then runs in a child (``python -I``:
nothing of the current directory), once as is and once with ``--reference`` (the formula's values
judged instead of the kernel's, which must conform), and the cell gets ``reproducer``: the script,
its data, whether it reproduced (the same signal for a crash, or the write outside a buffer that
causes it) and whether it passes with the reference. The caller writes the report
(``report/document.py``'s ``write``, the one writer of report.json).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import types

import torch

from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.cases.memory import bits
from mla_fuse_conformance.commands.repro import formulas
from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.contract.implementation import ImplementationError, load_implementation
from mla_fuse_conformance.declarations.operations import (CACHING_OPERATIONS, FUSED_OPERATIONS, OPERATION_ARGUMENTS,
                                                          ROTATING_OPERATIONS)
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_conformance.running.checks import BUFFER_OF_ARGUMENT

LITERAL_ELEMENTS = 64  # a buffer with more elements goes to the .pt file
TIMEOUT_SECONDS = 60
DIRECTORY = "reproducers"
# what a script prints when the kernel wrote into a guard: the heap corruption or invalid access behind a crash
OUTSIDE = re.compile(r"^wrote \d+ bytes (before the start|past the end) of \S+'s storage", re.MULTILINE)
CASE_TYPES = ("RopeCase", "MlaCase", "FlashCase")  # the cases of the five operations (not compile-pass cases)


def slug(cell: dict) -> str:
    """A file name for a cell: its property's function, its kind, and a digest of its id."""
    function = cell["property"].rpartition(":")[2]
    kind = re.sub(r"[^a-z0-9]+", "-", cell["kind"].partition(",")[0].lower()).strip("-")
    return f"{function}-{kind}-{hashlib.sha1(cell['id'].encode()).hexdigest()[:8]}"


def operation_of(record: dict) -> str:
    """The operation a script calls: the fused one of a fused-vs-unfused property, else the only one."""
    operations = record["operations"]
    return next((op for op in operations if op in FUSED_OPERATIONS), operations[0])


def tensors_table(built, operation: str) -> tuple[dict, dict]:
    """``(rows, values)``: per tensor argument of ``operation`` (CONTRACT §4's names) its buffer (the flat
    tensor, or the earlier argument whose buffer it shares), sizes, strides and storage offset; the
    other arguments as values."""
    rows, values, first = {}, {}, {}
    for name in OPERATION_ARGUMENTS[operation]:
        arg = BUFFER_OF_ARGUMENT.get(name, name)
        if not hasattr(built.args[arg], "data_ptr"):
            values[name] = built.args[arg]
            continue
        buffer = built.buffer_of(arg)
        geometry = buffer.views[arg]
        owner = first.setdefault(buffer.name, name)
        rows[name] = (buffer.flat if owner == name else owner, geometry.size, geometry.stride, geometry.offset)
    return rows, values


def data_lines(rows: dict, values: dict) -> tuple[list[str], dict]:
    """The script's ``TENSORS`` and ``ARGS``, and the buffers too large for a literal (as integers)."""
    large, lines = {}, [formulas.TENSORS_HEAD]
    for name, (flat, *view) in rows.items():
        if isinstance(flat, str):
            buffer = repr(flat)
        else:
            raw = bits(flat.cpu())
            large.update({name: raw} if flat.numel() > LITERAL_ELEMENTS else {})
            buffer = f"({flat.dtype}, {flat.data_ptr() % 64}, {'pt' if name in large else raw.tolist()!r})"
        lines.append(f"    {name!r}: ({buffer}, {', '.join(map(repr, view))}),")
    lines += ["}", f"ARGS = {values!r}"] + ([formulas.DATA] if large else [])
    return lines, large


def kernel_lines(operation: str, source: str | None, target: dict) -> list[str]:
    """``def kernel(...)``: the adapter's call source inlined, else its method, imported by module path."""
    arguments = ", ".join(OPERATION_ARGUMENTS[operation])
    lines = [f"def kernel({arguments}):"]
    if source:
        return lines + [textwrap.indent(textwrap.dedent(source).strip(), "    ")]
    module, top = target["module"], target["module"].split(".")[0]
    found = f"__import__('importlib').import_module({module!r})"
    found = f"getattr({found}, {target['attr']!r})" if target["attr"] else found
    hint = (f"put the directory holding {top!r} on PYTHONPATH (when this script was written: "
            f"{target['directory']}), e.g.  PYTHONPATH={shlex.quote(target['directory'])} python THIS_SCRIPT")
    return lines + [f"    try:  # the adapter, by module name (it was {target['path']})",
                    f"        impl = {found}",
                    "    except ModuleNotFoundError as error:",
                    f"        if error.name != {top!r}:",
                    "            raise",
                    f"        print('reproducer: cannot run: the adapter module {module} is not importable: '",
                    f"              {hint!r}.replace('THIS_SCRIPT', sys.argv[0]), file=sys.stderr)",
                    "        sys.exit(2)  # not 1, which says the kernel differs",
                    f"    (impl() if isinstance(impl, type) else impl).{operation}({arguments})"]


def script_text(cell: dict, record: dict, declaration: dict, source: str | None, target: dict) -> tuple[str, dict]:
    """The script for ``cell`` (its failure file read into ``record``), and the tensors of its .pt file."""
    case = case_types.from_jsonable(record["case"])
    operation = operation_of(record)
    device = "cuda" if str(record.get("device", "cpu")).startswith("cuda") else "cpu"
    lines, large = data_lines(*tensors_table(tensors.build(case, "cpu"), operation))
    title = f"{operation}: {cell['kind']} on {cell['condition']['text']} ({cell['property']})"
    fp8 = operation in CACHING_OPERATIONS and tensors.fp8_format(case.kv_cache_dtype) is not None
    crash = re.search(r"\((SIG[A-Z]+)\)", cell["kind"]) if cell["kind"].startswith("crashed") else None
    crash = crash and crash.group(1) + (": heap corruption" if crash.group(1) == "SIGABRT" else "")
    text = "\n".join([formulas.HEADER.format(title=title, about=textwrap.fill(
                          formulas.ABOUT.format(origin=pathlib.Path(record["file"]).name), 118)),
                      *constants(operation, case, declaration, device), *lines, "",
                      *kernel_lines(operation, source, target), formulas.program(operation, fp8, crash or ""), ""])
    return text, large


def constants(operation: str, case, declaration: dict, device: str) -> list[str]:
    """The device, and the declarations and sizes the formula of ``operation`` reads."""
    caching = operation in CACHING_OPERATIONS
    values, notes = {"DEVICE": device, **({"TOKENS": case.tokens} if caching else {})}, []
    if operation in ROTATING_OPERATIONS:
        values["PER_OP"] = declaration.get("rounding") == "per_op"
        notes.append("PER_OP: rounding=\"per_op\", CONTRACT §5's wider bound")
    if operation in FUSED_OPERATIONS:
        values["PADDED_ROWS"] = declaration.get("padded_rows", "rotated")
        notes.append("PADDED_ROWS: the rows rotated where the slot is padded (§4)")
    line = f"{', '.join(values)} = {', '.join(map(repr, values.values()))}"
    lines = [f"{line}  # {'; '.join(notes)}"] if notes else [line]
    lines = lines if len(lines[0]) <= 120 else [f"# {'; '.join(notes)}", line]
    fmt = tensors.fp8_format(case.kv_cache_dtype) if caching else None
    if fmt is not None:
        lines.append(f"FP8, NAN_CODE, INF_CODE = ({tensors.FLOAT8_STORAGE[fmt]}, {ref_fp8.FORMATS[fmt].max_finite!r}), "
                     f"{0x7D if fmt == 'e5m2' else 0x7F}, {0x7C if fmt == 'e5m2' else -1}  # codes' dtype, finite max; "
                     "magnitudes >= NAN_CODE: NaN, == INF_CODE: inf")
    return lines


def adapter_target(impl, implementation: dict) -> dict:
    """How a script imports an adapter that declares no call source: module, attribute, directory
    (``impl`` None: the adapter no longer loads here; then as report.json's ``implementation`` names it)."""
    module_path, target = implementation.get("module_path"), getattr(impl, "target", None)
    if impl is None:
        module, _, attr = implementation["spec"].partition(":")
        attr = attr or None
    else:
        module = target.__name__ if isinstance(target, types.ModuleType) else type(target).__module__
        attr = None if isinstance(target, types.ModuleType) else type(target).__name__
    path = pathlib.Path(module_path or ".")
    up = len(module.split(".")) - 1 + (path.name == "__init__.py")
    directory = str(path.parents[up]) if module_path and up < len(path.parents) else "."
    return {"module": module, "attr": attr, "path": str(path), "directory": directory}


# ``python -I -c RUN_WITH_PATH SCRIPT DIR [OPTIONS]``: the script as ``python SCRIPT`` runs it, with ``DIR`` (the
# adapter's, as a user puts it on PYTHONPATH) first on sys.path; ``-I`` keeps the rest out (Python 3.10 has no -P).
RUN_WITH_PATH = ("import runpy, sys; script, path = sys.argv[1:3]; sys.path.insert(0, path); "
                 "sys.argv = [script, *sys.argv[3:]]; runpy.run_path(script, run_name='__main__')")


def run_script(python: str, script: pathlib.Path, *options: str,
               path: str | None = None) -> subprocess.CompletedProcess | None:
    """The script run by ``python`` in a child, from an empty directory and with ``-I`` (neither the script's
    directory nor PYTHON* variables reach its imports; ``path``: the adapter's directory, put on sys.path as
    PYTHONPATH would), or None when it ran past ``TIMEOUT_SECONDS``."""
    command = [python, "-I", *(("-c", RUN_WITH_PATH) if path else ()), str(script), *((path,) if path else ()),
               *options]
    with tempfile.TemporaryDirectory() as empty:
        try:
            return subprocess.run(command, cwd=empty, capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            return None


def signal_name(run: subprocess.CompletedProcess | None) -> str | None:
    if run is None or run.returncode >= 0:
        return None
    try:
        return signal.Signals(-run.returncode).name
    except ValueError:
        return f"signal {-run.returncode}"


def reproduced(kind: str, run: subprocess.CompletedProcess | None) -> bool:
    """Did the script fail as the cell did: the same signal (or, for a crash, the write outside an argument's
    buffer that causes it: ``OUTSIDE``), a hang, the same exception type, or a difference from the formula."""
    if kind.startswith("hung"):
        return run is None
    if run is None:
        return False
    if kind.startswith("crashed"):
        same_signal = signal_name(run) is not None and f"({signal_name(run)})" in kind
        return same_signal or (run.returncode == 1 and OUTSIDE.search(run.stdout) is not None)
    if kind.startswith("raised"):
        errors = [line for line in run.stderr.splitlines() if line.strip()]
        return run.returncode == 1 and bool(errors) and errors[-1].partition(":")[0].endswith(kind.split()[1])
    return run.returncode == 1 and "differ from the formula" in run.stdout


def call_source(target, operation: str) -> str | None:
    """The adapter's ``call_source[operation]``, unless a subclass overrides the operation's method below
    the class that declares it (a team's adapter deriving from a shipped one): that source would call
    the base class's kernel, so the adapter is imported by its module path instead."""
    source = (getattr(target, "call_source", None) or {}).get(operation)
    mro = (target if isinstance(target, type) else type(target)).__mro__
    method, declared = (next((k for k in mro if name in vars(k)), None) for name in (operation, "call_source"))
    return source if method is None or declared is None or issubclass(declared, method) else None


def write_script(cell: dict, record: dict, directory: pathlib.Path, implementation: dict,
                 impl) -> tuple[pathlib.Path, pathlib.Path | None, str | None]:
    """Write the reproducer of one cell from its failure ``record`` (the JSON of ``cell["replay"]["file"]``):
    the script, its .pt file (None when every buffer is a literal) and the directory the adapter module it
    imports by name is in (None: the call is inlined, or the adapter is importable from anywhere)."""
    record = dict(record, file=cell["replay"]["file"])
    operation = operation_of(record)
    source = call_source(impl.target, operation) if impl is not None else None
    script = directory / f"{slug(cell)}.py"
    target = adapter_target(impl, implementation)
    text, large = script_text(cell, record, implementation.get("declaration", {}), source, target)
    script.write_text(text)
    data = script.with_suffix(".pt") if large else None
    if data is not None:
        torch.save(large, data)
    return script, data, None if source or target["directory"] == "." else target["directory"]


def run_reproducer(cell: dict, script: pathlib.Path, data: pathlib.Path | None, python: str,
                   path: str | None = None) -> dict:
    """Run the script as is and with ``--reference``: the cell's ``reproducer`` entry."""
    run, with_reference = run_script(python, script, path=path), run_script(python, script, "--reference", path=path)
    return {"script": str(script), "data": str(data) if data else None, "reproduced": reproduced(cell["kind"], run),
            "signal": signal_name(run), "passes_with_reference": with_reference is not None
            and with_reference.returncode == 0}


def load_adapter(report: dict):
    """The report's implementation, loaded (None when it no longer loads: scripts then import it by path)."""
    try:
        return load_implementation(report["implementation"]["spec"])
    except (ImplementationError, ImportError, RuntimeError):
        return None


def write_reproducers(report_dir: pathlib.Path, report: dict, python: str = sys.executable) -> dict:
    """Per failing cell with a case of the five operations: its reproducer (module docstring), run by
    ``python``; ``run.phases["reproducers"]`` its seconds. Returns ``report``, changed in place (not written)."""
    started, report_dir = time.monotonic(), pathlib.Path(report_dir).absolute()  # scripts run from elsewhere
    # one per defect's cell as derived: a cell carried from another property (``found_by``) is that cell's
    # condition confirmed here, and the cell it was found as has the script
    cells = [cell for cell in report.get("cells", []) if (cell.get("replay") or {}).get("file")
             and cell.get("source") != "another property"]
    impl = load_adapter(report) if cells else None
    directory = report_dir / DIRECTORY
    for cell in cells:
        cell["reproducer"] = None
        try:
            record = json.loads(pathlib.Path(cell["replay"]["file"]).read_text())
            if (record.get("case") or {}).get("type") not in CASE_TYPES:
                continue  # a compile-pass case: its failure file replays it (mla-fuse repro)
            directory.mkdir(parents=True, exist_ok=True)
            script, data, path = write_script(cell, record, directory, report["implementation"], impl)
        except Exception as error:  # noqa: BLE001 - one cell's script must not cost the report
            print(f"reproducer: none for {cell['id']}: {type(error).__name__}: {error}"[:300], flush=True)
            continue
        found = cell["reproducer"] = run_reproducer(cell, script, data, python, path)
        print(f"reproducer: {found['script']} ({'reproduced' if found['reproduced'] else 'did not reproduce'}"
              f"{'' if found['passes_with_reference'] else '; FAILS with --reference'})", flush=True)
    report.setdefault("run", {}).setdefault("phases", {})["reproducers"] = round(time.monotonic() - started, 1)
    return report
