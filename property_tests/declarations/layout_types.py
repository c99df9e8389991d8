"""The types of ``engine_layouts``: a view, a call, a cache form and an engine's layout, with the
two functions that turn a layout's size expressions into numbers (``size_of``) and a view into
``Placement`` keyword arguments (``placement_of``).

A leaf module: it imports nothing of the suite.
"""

from __future__ import annotations

import ast
import dataclasses
import operator

# Every K/V form, one name each across the suite (cases.types.FlashCase.kv_form, cases/engine_caches.py).
KV_FORMS = {
    "split": "two allocations, key_cache [NB, B, Hkv, D] and value_cache [NB, B, Hkv, Dv]",
    "flash": "one [2, NB, B, Hkv, D] tensor, key_cache, value_cache = kv.unbind(0) (vLLM's FlashAttention, "
             "SGLang's MHA pool)",
    "flashinfer": "one [NB, 2, B, Hkv, D] tensor, key_cache, value_cache = kv.unbind(1) (K and V of a block "
                  "side by side: FlashInfer's paged_kv_cache)",
    "halves": "K and V are the two halves of each head's row: one [NB, B, Hkv, 2D] tensor (NHD) or "
              "[NB, Hkv, B, 2D] (HND), key_cache, value_cache = kv.split(D, dim=-1); K and V of one "
              "head sit side by side, so a key_cache row's head stride is 2D, not D (vLLM 0.33's pool)",
}
# How an fp8 cache's scale is given: 1.0, one value (non-unit), one value per KV head (each different).
SCALE_KINDS = ("unit", "tensor", "per_head")
ENGINES = {"vllm": "0.33.0", "sglang": "0.5.23", "flashinfer": "0.7.2", "lmdeploy": "0.18.0"}


@dataclasses.dataclass(frozen=True)
class View:
    """One input tensor as passed: a view of shape ``shape`` of ``parent`` (shape ``parent_shape``,
    written in the view's rank), starting at index ``start`` in each dim."""

    argument: str                  # the operation's argument name (declarations.operations)
    operations: tuple[str, ...]    # the operations it is that argument of
    shape: tuple[str, ...]
    parent: str
    parent_shape: tuple[str, ...]
    start: tuple[str, ...]
    source: str                    # path:line where the view is made


@dataclasses.dataclass(frozen=True)
class Call:
    operation: str                 # one of declarations.operations.OPERATIONS
    function: str                  # the engine's function at the call site
    source: str                    # path:line of the call


@dataclasses.dataclass(frozen=True)
class CacheForm:
    pool: str
    kv: str
    hnd: bool
    allocation: str                # the allocation as the engine makes it
    source: str


@dataclasses.dataclass(frozen=True)
class EngineLayout:
    name: str
    engine: str
    attention: str                 # "mla" or "mha"
    calls: tuple[Call, ...]
    views: tuple[View, ...]
    cache: CacheForm
    slot_dtype: str                # "int64"; FlashInfer takes int32 page tables instead of slots
    padding_slot: int | None       # what a padded token's slot holds; None: no padding rows
    positions_dtype: str           # "" where the Python sources do not say
    table_dtype: str               # TableSpec.dtype: "float32" or "input"
    block_default: int
    block_sizes: tuple[int, ...]   # sizes allowed besides multiples of block_multiple
    block_multiple: int            # 0: only block_sizes
    fp8_scale: str                 # how an fp8 cache's scale is taken
    scales: tuple[str, ...]        # SCALE_KINDS the engine passes with an fp8 cache; () for no fp8 cache
    sources: tuple[str, ...]       # path:line of the dtypes, padding, block sizes and scale
    notes: str = ""

    @property
    def version(self) -> str:
        return ENGINES[self.engine]

    @property
    def operations(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(call.operation for call in self.calls))

    def allows_block_size(self, block_size: int) -> bool:
        return block_size in self.block_sizes or bool(self.block_multiple and block_size % self.block_multiple == 0)

    def all_sources(self) -> tuple[str, ...]:
        return (*(c.source for c in self.calls), *(v.source for v in self.views), self.cache.source, *self.sources)


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def size_of(expression: str, sizes: dict[str, int]) -> int:
    """The value of a size expression (names, integers, ``+ - *``, parentheses) for ``sizes``."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in sizes:
                raise ValueError(f"size_of: {expression!r} names {node.id!r}, not one of {sorted(sizes)}")
            return sizes[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"size_of: {expression!r} is not a sum or product of sizes")
    return value(ast.parse(expression, mode="eval").body)


def placement_of(view: View, sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """``Placement`` keyword arguments (``pad``, ``offset``) of ``view`` in its parent."""
    shape = [size_of(e, sizes) for e in view.shape]
    parent = [size_of(e, sizes) for e in view.parent_shape]
    start = [size_of(e, sizes) for e in view.start]
    pad = tuple(p - s for p, s in zip(parent, shape))
    if any(p < 0 for p in pad) or any(o > p for o, p in zip(start, pad)):
        raise ValueError(f"placement_of: {view.argument} {shape} at {start} does not fit its parent {parent}")
    return dict(pad=pad, offset=tuple(start))
