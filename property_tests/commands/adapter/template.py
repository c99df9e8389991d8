"""The adapter skeleton ``mla-fuse adapter --template`` writes, with the contract's signatures.

The class declares ``name``, ``rounding``, ``padded_rows``, ``checks_inputs``, ``required`` and
``capabilities`` (each commented with its allowed values and default) and has one method per
chosen operation with exactly the positional parameters of CONTRACT §4, generated from
``declarations.operations.OPERATION_ARGUMENTS`` so it cannot drift, a docstring giving each
argument's shape and dtype, and a body that raises ``NotImplementedError("call your kernel here")``.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap

from mla_fuse_conformance.contract.capabilities import TABLE_POLICIES, Capabilities
from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS, PADDED_ROW_MODES, ROUNDING_MODES
from mla_fuse_conformance.declarations.options import CLI_IMPL_OPTION, PYTEST_IMPL_OPTION

# What each operation does, and each argument's shape, dtype and role (CONTRACT §1-4); an
# argument whose meaning depends on the operation is described under (operation, argument).
SUMMARIES = {
    "rotary_embedding": "Rotate the first R elements of every head of query and key, in place.",
    "concat_and_cache_mla": "Write [kv_c | k_pe] of each token into its slot of kv_cache.",
    "concat_and_cache_mla_rope_fused": "Rotate q_pe and k_pe in place and write [kv_c | rotated k_pe] into "
                                       "kv_cache, in one pass.",
    "reshape_and_cache_flash": "Write key and value of each token into its slot of key_cache and value_cache.",
    "rope_and_reshape_and_cache_flash": "Rotate query and key in place and write rotated key and value into "
                                        "key_cache and value_cache, in one pass.",
}
ACTIVATION = "float32, bfloat16 or float16"
FP8_SCALE = "fp8: code = rne_satfinite(float32(x) / scale)"
ARGUMENTS = {
    "positions": "[T] int64 or int32: the row of cos_sin_cache of each token",
    "head_size": "int: D, the head size",
    "cos_sin_cache": "[P, R] float32 or the activations' dtype: row p holds R/2 cosines then R/2 sines",
    "is_neox": "bool: True pairs (x[j], x[j + R/2]) (NeoX), False pairs (x[2j], x[2j+1]) (GPT-J)",
    "q_pe": f"[T, H, R] {ACTIVATION}, rotated in place; often the strided slice q[..., nope:]",
    "kv_c": f"[T, L] {ACTIVATION}: the latent; often a column slice of one [T, L + R] tensor",
    "k_pe": "[T, R] the activations' dtype: the rotary part of the key",
    "kv_cache": "[NB, B, L + R] written in place, entry = [kv_c | k_pe]: the activations' dtype, or uint8 / "
                "float8 for fp8 kv_cache_dtype; may be a view into a pool",
    "slot_mapping": "[T' <= T] int64 or int32: slot s -> block s // B, offset s % B; s < 0 writes nothing, "
                    "rows past T' are not written",
    "kv_cache_dtype": 'str: "auto", "bfloat16", "float16", "float32" (source bits) or "fp8", "fp8_e4m3", '
                      '"fp8_e5m2"',
    "scale": f"[1] float32 on the device; {FP8_SCALE}",
    "kv_cache_scale": f"[1] float32 on the device; {FP8_SCALE}",
    "value": "[T, Hkv, Dv] the activations' dtype",
    "key_cache": "[NB, B, Hkv, D] written in place (or any strided view of it, HND included)",
    "value_cache": "[NB, B, Hkv, Dv] written in place (or any strided view of it, HND included)",
    "k_scale": f"[1] or [Hkv] float32 on the device; {FP8_SCALE}",
    "v_scale": f"[1] or [Hkv] float32 on the device; {FP8_SCALE}",
}
BY_OPERATION = {
    ("rotary_embedding", "query"): f"[T, H, D] or [T, H * D] {ACTIVATION}, rotated in place",
    ("rotary_embedding", "key"): "[T, Hkv, D] or [T, Hkv * D] the query's dtype, rotated in place; or None",
    ("concat_and_cache_mla_rope_fused", "k_pe"): "[T, R] the activations' dtype, rotated in place",
    ("reshape_and_cache_flash", "key"): f"[T, Hkv, D] {ACTIVATION}",
    ("rope_and_reshape_and_cache_flash", "query"): f"[T, H, D] {ACTIVATION}, rotated in place",
    ("rope_and_reshape_and_cache_flash", "key"): "[T, Hkv, D] the query's dtype, rotated in place",
}


WIDTH = 100  # the generated file's line width


def argument_doc(operation: str, argument: str) -> str:
    return BY_OPERATION.get((operation, argument)) or ARGUMENTS[argument]


def class_name(name: str) -> str:
    """``my-kernels`` -> ``MyKernels``."""
    words = [word for word in re.split(r"[^0-9A-Za-z]+", name) if word]
    joined = "".join(word[0].upper() + word[1:] for word in words) or "MyKernels"
    return joined if joined[0].isalpha() else f"Kernels{joined}"


def method(operation: str) -> str:
    """One operation's method: the contract's parameters, a docstring of them, a body to fill."""
    arguments = OPERATION_ARGUMENTS[operation]
    width = max(len(argument) for argument in arguments)
    signature = textwrap.wrap(f"def {operation}(self, {', '.join(arguments)}):", WIDTH, initial_indent=" " * 4,
                              subsequent_indent=" " * (9 + len(operation)))
    lines = [*signature, f'        """{SUMMARIES[operation]}', ""]
    for argument in arguments:
        lines += textwrap.wrap(f"{argument:<{width}}  {argument_doc(operation, argument)}", WIDTH,
                               initial_indent=" " * 8, subsequent_indent=" " * (10 + width))
    lines += ['        """', '        raise NotImplementedError("call your kernel here")']
    return "\n".join(lines)


def _quoted(values) -> str:
    return ", ".join(f'"{value}"' for value in values)


def _literal(value) -> str:
    """A default as Python source, strings in double quotes: ``("neox", "gptj")``."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return f"({', '.join(map(_literal, value))}{',' if len(value) == 1 else ''})"
    return repr(value)


def declaration_lines(name: str) -> list[str]:
    """The declarations, each below a comment of its allowed values and default."""
    return [
        "    # A label for reports (default: the class name).",
        f'    name = "{name}"',
        f'    # One of {_quoted(ROUNDING_MODES)}: "{ROUNDING_MODES[0]}" computes in fp32 and rounds once (the',
        f'    # default), "{ROUNDING_MODES[1]}" rounds after every operation (CONTRACT §5: a wider bound).',
        f'    rounding = "{ROUNDING_MODES[0]}"',
        f"    # Rows whose slot is < 0 or past slot_mapping: {_quoted(PADDED_ROW_MODES)}",
        f'    # (default "{PADDED_ROW_MODES[0]}": q and k rotated, as the unfused chain does).',
        f'    padded_rows = "{PADDED_ROW_MODES[0]}"',
        "    # True if bad input raises ValueError/TypeError naming the argument before any write",
        "    # (then the bad-input properties apply). Default: False.",
        "    checks_inputs = False",
        "    # Operations that must be provided: a missing one fails instead of being skipped. Default: ().",
        "    required = ()",
    ]


def capability_lines() -> list[str]:
    """``capabilities``: every field of ``Capabilities`` at its default (the whole contract), commented out."""
    lines = ["    # What you support. A field left out defaults to the whole contract (shown commented out):",
             "    # tuples list the values supported, bools whether that case is, table_dtypes is one of",
             f"    # {_quoted(TABLE_POLICIES)}, sizes are None (any) or the sizes your kernel is built for.",
             "    # Or a dict from operation name to such a dict.",
             "    capabilities = {"]
    lines += [f'        # "{field.name}": {_literal(field.default)},' for field in dataclasses.fields(Capabilities)]
    return lines + ["    }"]


def template(operations: tuple[str, ...], name: str, module: str) -> str:
    """The adapter module's text: a class named after ``name`` providing ``operations``."""
    cls = class_name(name)
    head = [f'"""Adapter of {name} for the mla_fuse conformance suite (CONTRACT §4).', "",
            f"Run:  mla-fuse verify {CLI_IMPL_OPTION} {module}:{cls}",
            f"      python -m pytest --pyargs mla_fuse_conformance {PYTEST_IMPL_OPTION}={module}:{cls}",
            '"""', "", "", f"class {cls}:"]
    body = declaration_lines(name) + capability_lines()
    return "\n".join(head + body + [""] + "\n\n".join(method(op) for op in operations).split("\n")) + "\n"
