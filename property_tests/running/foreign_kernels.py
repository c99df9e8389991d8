"""Running Triton kernels other projects ship, from their source files, with the real Triton.

Shared by the adapters that verify a third party's Triton kernels (``adapters/vllm_triton.py``,
``adapters/flaggems.py``, ``adapters/liger.py``; adapters are leaves and import no other adapter, so
what they share lives here). Two pieces:

``load_jit_functions`` parses a kernel file with ``ast``, takes the named function definitions,
checks their decorators are exactly the ones expected, drops them, and compiles those definitions
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

``exact_interpreter_casts``: Triton's interpreter converts floats to fp8 wrongly
(triton-lang/triton#8322: ties rounded up, 500 stored as 256, overflow and NaN stored as finite
codes or NaN at random), flushes bfloat16 subnormals to zero when it widens them to fp32, and
narrows fp32 (and fp16, through fp32) to bfloat16 by truncating: 1 + 2^-8 + 2^-10 is stored as 1.0
where a GPU stores 1.0078125. It also holds bfloat16 as its uint16 bits and runs arithmetic on
those bits (``x * y`` of two bfloat16 tensors multiplies the bit patterns; Triton's debugging guide:
the interpreter "does not support operations on bfloat16", triton#10919). On a GPU these are
Triton's code generation: conversions round to nearest even, fp8 saturating at the finite max (what
CONTRACT §3 asks), and bfloat16 add, sub and mul are correctly rounded. Within the context, the
interpreter does these exactly: bf16 -> fp32 (the bits shifted); fp32 -> bf16 in its default
rounding (torch's round to nearest even; an explicit ``fp_downcast_rounding="rtz"`` still truncates);
fp32/fp16/bf16 -> fp8 E4M3FN/E5M2 (torch's round to nearest even after clamping to the finite max;
NaN kept); and elementwise binary and unary operations on bfloat16 operands (computed on their fp32
values, the result rounded to nearest even: for add, sub and mul the correctly rounded bf16 result).
Every other conversion and operation is Triton's own; ``tl.fma``, ``tl.dot`` and reductions of
bfloat16 are not corrected (no adapted kernel uses them).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
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
    definitions see (copied; ``__name__`` is set to the file's name). In those globals each name then
    stands for its built function, as in the file's module after ``@triton.jit``: a definition calling
    another one loaded with it (a ``@jit`` helper of the same file) calls the built helper, which the
    interpreter rewrites and a GPU compiles, not the bare Python function."""
    scope = _compiled(path, decorated, namespace, source)
    if interpreted:
        from triton.runtime.interpreter import InterpretedFunction

        built = {name: InterpretedFunction(scope[name]) for name in decorated}
    else:
        built = {name: triton.runtime.jit.JITFunction(scope[name]) for name in decorated}
    scope.update(built)
    return built


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


# ---------------------------------------------------------------- the interpreter's float conversions


def _widened(data: np.ndarray, dtype) -> np.ndarray:
    """fp32/fp16/bf16 interpreter data (bf16 is held as uint16) as float32, exactly."""
    if dtype == tl.bfloat16:
        bits = np.frombuffer(data.tobytes(), dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(data.shape)
    return data.astype(np.float32)


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to nearest even as bfloat16, held as the interpreter holds it (uint16)."""
    wide = torch.from_numpy(np.array(values, dtype=np.float32).reshape(-1))  # a copy: frombuffer is read-only
    return wide.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(np.shape(values))


def exact_convert_float(original, data, input_dtype, output_dtype, rounding_mode):
    """Triton's ``interpreter._convert_float`` with the conversions above done exactly (module
    docstring); any other conversion goes to ``original``."""
    from triton._C.libtriton import ir

    if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
        return _widened(data, input_dtype).view(np.uint32)
    if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and rounding_mode in (None, ir.ROUNDING_MODE.RTNE):
        return _bf16_bits(np.frombuffer(data.tobytes(), dtype=np.float32).reshape(data.shape))
    fp8 = TRITON_FP8.get(output_dtype)
    if (fp8 is not None and input_dtype in (tl.float32, tl.float16, tl.bfloat16)
            and rounding_mode in (None, ir.ROUNDING_MODE.RTNE)):
        values = torch.from_numpy(np.ascontiguousarray(_widened(data, input_dtype)))
        limit = FINITE_MAX[fp8]
        return values.clamp(-limit, limit).to(fp8).view(torch.uint8).numpy().reshape(data.shape)
    return original(data, input_dtype, output_dtype, rounding_mode)


def _bf16_binary_op(builder, original, lhs, rhs, op):
    """``InterpreterBuilder.binary_op`` computing on the values of bfloat16 operands (module docstring)."""
    if lhs.dtype.scalar != tl.bfloat16 or rhs.dtype.scalar != tl.bfloat16:
        return original(builder, lhs, rhs, op)
    from triton.runtime.interpreter import TensorHandle

    result = np.asarray(op(_widened(lhs.data, tl.bfloat16), _widened(rhs.data, tl.bfloat16)))
    return TensorHandle(_bf16_bits(result) if result.dtype == np.float32 else result, tl.bfloat16)


def _bf16_unary_op(builder, original, arg, op):
    """``InterpreterBuilder.unary_op`` computing on the values of a bfloat16 operand."""
    if arg.dtype.scalar != tl.bfloat16:
        return original(builder, arg, op)
    from triton.runtime.interpreter import TensorHandle

    result = np.asarray(op(_widened(arg.data, tl.bfloat16)))
    return TensorHandle(_bf16_bits(result) if result.dtype == np.float32 else result, tl.bfloat16)


@contextlib.contextmanager
def exact_interpreter_casts():
    """Within: the interpreter converts as ``exact_convert_float`` and computes on bfloat16 values
    (module docstring); restored on exit."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    originals = interpreter._convert_float, builder.binary_op, builder.unary_op

    def binary_op(self, lhs, rhs, op):
        return _bf16_binary_op(self, originals[1], lhs, rhs, op)

    def unary_op(self, arg, op):
        return _bf16_unary_op(self, originals[2], arg, op)

    interpreter._convert_float = functools.partial(exact_convert_float, originals[0])
    builder.binary_op, builder.unary_op = binary_op, unary_op
    try:
        yield
    finally:
        interpreter._convert_float, builder.binary_op, builder.unary_op = originals


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
