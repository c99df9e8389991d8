"""Cases that cross each size boundary of real models, one dimension at a time.

A kernel tiles each dimension: a tile over heads or tokens with no loop around it leaves the
heads or tokens past the tile untouched; a grid dimension capped at 65,535 programs drops the
rows past it; a narrow index type wraps past 2^15 or 2^16. Such bugs only show at sizes past a
power of two, and real models run there (``declarations/presets.py``: 128 query heads, latent
512, 16,384-token prefill chunks, 163,840-row YaRN tables). The random cases of a CPU profile
stay small (the Triton interpreter runs every kernel there), so every profile runs these as
explicit examples: for each dimension, a size just past every power of two from 16 up to the
presets' largest value in that dimension (``past_powers``), with every other size minimal, so
each costs little even on the CPU. Tokens also cross CUDA's grid limit (65,535 rows), and the
table rows (hence positions) cross 2^15 and 2^16.

``CROSSINGS`` lists which dimensions each operation has; ``crossings(op)`` gives the cases;
``docs/REAL_SIZES.md`` lists them per profile with what they cost.
"""

from __future__ import annotations

import dataclasses

from mla_fuse_conformance.cases.types import FlashCase, MlaCase, PositionSpec, RopeCase, SlotSpec, TableSpec
from mla_fuse_conformance.declarations.operations import FAMILY_OF_OPERATION, FUSED_OPERATIONS, OPERATIONS
from mla_fuse_conformance.declarations.presets import SERVING, largest

SMALLEST_POWER = 16
TOKEN_BLOCK = 16  # the block size of the token crossings (vLLM's default)


def past_powers(top: int, step: int = 1) -> tuple[int, ...]:
    """``2^k + step`` for every power of two ``2^k`` from 16 up to ``top``: ``past_powers(128)`` is
    ``(17, 33, 65, 129)``; ``step`` 2 keeps even sizes even (rotary widths)."""
    return tuple(2 ** k + step for k in range(SMALLEST_POWER.bit_length() - 1, top.bit_length())
                 if 2 ** k <= top)


def sizes(dimension: str) -> tuple[int, ...]:
    """The sizes a dimension's crossings take."""
    if dimension == "tokens":  # and past CUDA's grid limit: tokens in grid y/z drop rows past it
        return past_powers(largest("tokens")) + (SERVING.grid_rows + 2,)
    if dimension == "table_rows":  # positions up to rows - 1: past 2^15 and 2^16 (narrow position types)
        return past_powers(largest("table_rows"))
    if dimension == "rotary_dim":
        return past_powers(largest("rotary_dim"), step=2)
    return past_powers(largest(dimension))


# family -> the dimensions its cases cross; the rope-only ones apply to the rotating operations only
DIMENSIONS = {
    "rope": ("tokens", "heads", "kv_heads", "head_size", "rotary_dim", "table_rows"),
    "mla": ("tokens", "heads", "latent", "rotary_dim", "block_size", "table_rows"),
    "flash": ("tokens", "heads", "kv_heads", "head_size", "rotary_dim", "block_size", "table_rows"),
}
# the dimensions an unfused cache write does not have (no query, no table; MLA's k_pe is still R wide)
ROPE_ONLY = {"mla": {"heads", "table_rows"}, "flash": {"heads", "rotary_dim", "table_rows"}, "rope": set()}
CROSSINGS = {op: tuple(d for d in DIMENSIONS[FAMILY_OF_OPERATION[op]]
                       if op in FUSED_OPERATIONS or d not in ROPE_ONLY[FAMILY_OF_OPERATION[op]])
             for op in OPERATIONS}


def _table(rows: int = 8, rotary_dim: int = 2) -> TableSpec:
    return TableSpec("plain", rotary_dim, rows, poison_unused_rows=True)


def _rope(dimension: str, size: int, seed: int) -> RopeCase:
    case = RopeCase(seed=seed, tokens=3, heads=1, kv_heads=1, head_size=2, dtype="bfloat16", is_neox=True,
                    table=_table())
    if dimension == "table_rows":
        return dataclasses.replace(case, table=_table(size), positions=PositionSpec(pattern="last_rows"))
    if dimension == "head_size":  # rotary width 2: the rest of the head passes through
        return dataclasses.replace(case, head_size=size)
    if dimension == "rotary_dim":
        return dataclasses.replace(case, head_size=size, table=_table(rotary_dim=size))
    return dataclasses.replace(case, **{dimension: size})


def _cache_geometry(tokens: int, block_size: int) -> dict:
    """Blocks for ``tokens`` with spare slots; the slots include the first and the last of the cache."""
    return dict(tokens=tokens, num_blocks=(tokens + 1 + block_size - 1) // block_size + 1, block_size=block_size,
                slots=SlotSpec(tokens, placement="extremes"))


def _shared(case, dimension: str, size: int):
    """The crossings both cache families make the same way (None for the others)."""
    if dimension == "tokens":
        return dataclasses.replace(case, **_cache_geometry(size, TOKEN_BLOCK))
    if dimension == "block_size":
        return dataclasses.replace(case, **_cache_geometry(3, size))
    if dimension == "table_rows":
        return dataclasses.replace(case, table=_table(size), positions=PositionSpec(pattern="last_rows"))
    return None


def _mla(dimension: str, size: int, seed: int, fused: bool) -> MlaCase:
    case = MlaCase(seed=seed, heads=1, latent=1, rotary_dim=2, dtype="bfloat16", kv_cache_dtype="auto",
                   table=_table() if fused else TableSpec("plain", 2, 1), **_cache_geometry(3, 1))
    shared = _shared(case, dimension, size)
    if shared is not None:
        return shared
    if dimension == "rotary_dim":
        return dataclasses.replace(case, rotary_dim=size,
                                   table=_table(rotary_dim=size) if fused else TableSpec("plain", size, 1))
    return dataclasses.replace(case, **{dimension: size})


def _flash(dimension: str, size: int, seed: int, fused: bool) -> FlashCase:
    case = FlashCase(seed=seed, heads=1, kv_heads=1, head_size=2, value_head_size=2, dtype="bfloat16",
                     kv_cache_dtype="auto", table=_table() if fused else TableSpec("plain", 2, 1),
                     **_cache_geometry(3, 1))
    shared = _shared(case, dimension, size)
    if shared is not None:
        return shared
    if dimension == "kv_heads":  # one query head per KV head
        return dataclasses.replace(case, heads=size, kv_heads=size)
    if dimension == "head_size":  # keys and values alike; rotary width 2 (partial rotary)
        return dataclasses.replace(case, head_size=size, value_head_size=size)
    if dimension == "rotary_dim":
        return dataclasses.replace(case, head_size=size, value_head_size=2, table=_table(rotary_dim=size))
    return dataclasses.replace(case, **{dimension: size})


def crossing_case(operation: str, dimension: str, size: int, seed: int):
    """``operation``'s case with ``dimension`` at ``size`` and every other size minimal."""
    family = FAMILY_OF_OPERATION[operation]
    if family == "rope":
        return _rope(dimension, size, seed)
    if family == "mla":
        return _mla(dimension, size, seed, operation in FUSED_OPERATIONS)
    return _flash(dimension, size, seed, operation in FUSED_OPERATIONS)


def crossings(operation: str) -> list:
    """For each dimension of ``operation``, a case just past each power of two in it, every other
    size minimal (in ``CROSSINGS`` order, smallest first)."""
    cases = []
    for dimension in CROSSINGS[operation]:
        for size in sizes(dimension):
            cases.append(crossing_case(operation, dimension, size, len(cases) + 1))
    return cases
