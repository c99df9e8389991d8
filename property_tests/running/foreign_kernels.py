"""Running Triton kernels other projects ship, from their source files, with the real Triton.

Shared by the adapters that verify a third party's Triton kernels (``adapters/vllm_triton.py``,
``adapters/flaggems.py``; adapters are leaves and import no other adapter, so what they share lives
here). Two pieces:

``load_jit_functions`` parses a kernel file with ``ast``, takes the named function definitions,
checks their decorators are exactly the ones expected, drops them, and compiles those definitions
alone under the file's own name and line numbers, with globals the caller gives (the real
``triton`` and ``tl``, constants, helper namespaces). Each comes back built for the backend asked
for: an ``InterpretedFunction`` or a ``JITFunction``, what ``@triton.jit`` would have built. Triton
reads the source back through ``inspect`` from that file, so its errors point at the project's own
lines. Nothing of the project is imported; ``sys.modules`` and ``os.environ`` are not touched.
``source`` replaces the file's text (a planted kernel in the tests), registered with ``linecache``
under a name of its own, where Triton reads it back.

``exact_interpreter_casts``: Triton's interpreter converts floats to fp8 wrongly
(triton-lang/triton#8322: ties rounded up, 500 stored as 256, overflow and NaN stored as finite
codes or NaN at random) and flushes bfloat16 subnormals to zero when it widens them to fp32. On a
GPU these conversions are Triton's code generation: round to nearest even, saturating at the finite
max (what CONTRACT §3 asks). Within the context, the interpreter's float conversion is replaced for
exactly bf16 -> fp32 (the bits shifted) and fp32/fp16/bf16 -> fp8 E4M3FN/E5M2 (torch's round to
nearest even after clamping to the finite max; NaN kept); every other conversion is Triton's own.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import linecache
import pathlib

import numpy as np
import torch
import triton
import triton.language as tl

# fp8 format (torch dtype) -> largest finite magnitude
FINITE_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
TRITON_FP8 = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}


def load_jit_functions(path: pathlib.Path, decorated: dict[str, list[str]], namespace: dict, interpreted: bool,
                       source: str | None = None) -> dict:
    """Name -> the definition of that name in ``path`` built for the backend (module docstring).

    ``decorated`` maps each name to its expected decorators as written (``["triton.jit"]``); a definition
    missing, repeated or decorated otherwise raises ImportError naming the file, so a changed file is
    not launched differently from how its project launches it. ``namespace`` holds the globals the
    definitions see (copied; ``__name__`` is set to the file's name)."""
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
    if interpreted:
        from triton.runtime.interpreter import InterpretedFunction

        return {name: InterpretedFunction(scope[name]) for name in decorated}
    return {name: triton.runtime.jit.JITFunction(scope[name]) for name in decorated}


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


# ---------------------------------------------------------------- the interpreter's float conversions


def _widened(data: np.ndarray, dtype) -> np.ndarray:
    """fp32/fp16/bf16 interpreter data (bf16 is held as uint16) as float32, exactly."""
    if dtype == tl.bfloat16:
        bits = np.frombuffer(data.tobytes(), dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(data.shape)
    return data.astype(np.float32)


def exact_convert_float(original, data, input_dtype, output_dtype, rounding_mode):
    """Triton's ``interpreter._convert_float`` with the conversions above done exactly (module
    docstring); any other conversion goes to ``original``."""
    from triton._C.libtriton import ir

    if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
        return _widened(data, input_dtype).view(np.uint32)
    fp8 = TRITON_FP8.get(output_dtype)
    if (fp8 is not None and input_dtype in (tl.float32, tl.float16, tl.bfloat16)
            and rounding_mode in (None, ir.ROUNDING_MODE.RTNE)):
        values = torch.from_numpy(np.ascontiguousarray(_widened(data, input_dtype)))
        limit = FINITE_MAX[fp8]
        return values.clamp(-limit, limit).to(fp8).view(torch.uint8).numpy().reshape(data.shape)
    return original(data, input_dtype, output_dtype, rounding_mode)


@contextlib.contextmanager
def exact_interpreter_casts():
    """Within: the interpreter converts as ``exact_convert_float`` (restored on exit)."""
    from triton.runtime import interpreter

    original = interpreter._convert_float
    interpreter._convert_float = functools.partial(exact_convert_float, original)
    try:
        yield
    finally:
        interpreter._convert_float = original
