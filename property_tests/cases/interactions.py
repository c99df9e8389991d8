"""Cases where two conditions meet: a covering array of every feature value with every size crossing.

A boundary case (``boundaries.py``) crosses one size with everything else minimal; a random CPU
case has every feature but small sizes. A bug that needs a size past a boundary *and* an fp8
cache with a non-unit scale, or two sizes whose product passes a tile, is in neither. This module
pairs them. An operation's *parameters* are:

* ``size``: one of ``size_levels(operation)``: each dimension's first and last crossing past a
  power of two (``boundaries.sizes``; tokens up to 513, past the largest decode batch), and the
  products a kernel may tile (``PRODUCTS``: heads x rotary pairs, KV heads x head size at the
  presets' largest; tokens x heads past 2^16);
* every ``features.AXES`` axis that applies to the operation and has values a case can be moved
  to (``Axis.set``, or ``EXTRA_SETTERS`` for the values the conformance map never moves to).

A *row* assigns a value to some parameters; ``build(Design.of(operation), row, seed)`` turns it
into a case (the crossing's case, then each axis value in ``AXES`` order) or None where the values
cannot meet (heads ``1`` with 129 heads). ``cover_rows(operation)`` is a deterministic greedy
covering array of strength 2: every pair of parameter values that one case can hold is held by some case.
``ci/generate_interactions.py`` writes its rows to ``interaction_rows.json`` (committed data;
``tests/test_interactions.py`` checks it is current); ``interaction_cases(operation)`` builds them
and ``pair_coverage(cases, operation)`` says which pairs some case holds.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib

from mla_fuse_conformance.cases import boundaries, covering
from mla_fuse_conformance.cases.features import AXES, Axis, axes_for
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, RopeCase, ScaleSpec
from mla_fuse_conformance.declarations.operations import FAMILY_OF_OPERATION, ROTATING_OPERATIONS
from mla_fuse_conformance.declarations.presets import PRESETS, SERVING

replace = dataclasses.replace
SIZE = "size"
ROWS_FILE = pathlib.Path(__file__).with_name("interaction_rows.json")  # ci/generate_interactions.py writes it
# name -> the two dimensions a kernel may tile as one (rotary pairs: rotary_dim / 2)
PRODUCTS = {
    "heads x rotary pairs": ("heads", "rotary_dim"),
    "KV heads x head size": ("kv_heads", "head_size"),
    "tokens x heads": ("tokens", "heads"),
}
FAMILY_ATTENTION = {"rope": ("mla", "mha"), "mla": ("mla",), "flash": ("mha",)}
# the axes other axes apply under (an fp8 cache's scales, a float cache's dtype, a key's heads)
ENABLING_AXES = ("dtype", "key", "kv_cache_dtype")
# axes that are not parameters of the array: "head stride" refines "inputs" (its value "other" is a kind of
# "strided", which the array pairs; only "D" can be set, and every case the array builds has it)
UNPAIRED_AXES = ("head stride",)
_STRIDED = Placement(pad=(0, 3), offset=(0, 1), lead=1)  # rows (or heads) padded, 1 element in
_POOL_VIEW = Placement(pad=(1,), offset=(1,), lead=5, trail=3)  # a block past the view, 5 elements in


@dataclasses.dataclass(frozen=True)
class Level:
    """A value of the ``size`` parameter: ``sizes`` maps each dimension it sets to its size."""

    name: str
    sizes: tuple[tuple[str, int], ...]


# ---------------------------------------------------------------- the parameters


def _pairs_of(dimension: str, size: int) -> int:
    return size // 2 if dimension == "rotary_dim" else size


def _largest_product(operation: str, first: str, second: str) -> tuple[int, int]:
    """The factors of the largest ``first x second`` (rotary pairs for ``rotary_dim``) of any
    preset at TP 1 whose attention the operation serves. Tokens x heads: the largest decode batch
    plus one token, with the most heads: past 2^16 (CUDA's 65,535 programs in grid y or z for one
    program per token and head) at a 32nd of the cost of a prefill chunk's."""
    candidates = []
    for preset in PRESETS.values():
        if preset.attention not in FAMILY_ATTENTION[FAMILY_OF_OPERATION[operation]]:
            continue
        sizes = dict(preset.per_rank(1), tokens=SERVING.decode_tokens[1] + 1)
        if first in sizes and second in sizes:
            a, b = sizes[first], sizes[second]
            candidates.append((_pairs_of(first, a) * _pairs_of(second, b), a, b))
    _, a, b = max(candidates, key=lambda found: found[0])
    return a, b


def _crossed(dimension: str) -> tuple[int, int]:
    """A dimension's first and last crossing past a power of two. Tokens: past the largest decode
    batch (513): the prefill-sized crossings (4,097 to 65,537) cost seconds per case with an fp8
    cache and stay one dimension at a time (``boundaries.py``)."""
    top = SERVING.decode_tokens[1] + 1 if dimension == "tokens" else None
    crossed = [size for size in boundaries.sizes(dimension) if top is None or size <= top]
    return crossed[0], crossed[-1]


def size_levels(operation: str) -> tuple[Level, ...]:
    """The first and last crossing of each dimension of ``operation``, then its tiled products."""
    dimensions = boundaries.CROSSINGS[operation]
    levels = []
    for dimension in dimensions:
        levels += [Level(f"{dimension} {size}", ((dimension, size),)) for size in sorted(set(_crossed(dimension)))]
    for name, (first, second) in PRODUCTS.items():
        if first in dimensions and second in dimensions:
            a, b = _largest_product(operation, first, second)
            levels.append(Level(f"{name} {a} x {b}", ((first, a), (second, b))))
    return tuple(levels)


def parameters(operation: str) -> dict[str, tuple[str, ...]]:
    """``{parameter: values}``: ``size`` first, then the settable axes in ``AXES`` order."""
    found = {SIZE: tuple(level.name for level in size_levels(operation))}
    for axis in axes_for(operation in ROTATING_OPERATIONS):
        if axis.setter is not None and axis.name not in UNPAIRED_AXES:
            found[axis.name] = axis.values
    return found


# ---------------------------------------------------------------- building a row


def _strided(case, value):
    if isinstance(case, MlaCase):
        return replace(case, kv_packed=False, kv_c_place=_STRIDED, k_pe_place=_STRIDED, q_place=_STRIDED)
    fields = dict(qkv_packed=False, query_place=_STRIDED, key_place=_STRIDED)
    return replace(case, **fields, **({"value_place": _STRIDED} if isinstance(case, FlashCase) else {}))


def _other_scale(case, value):
    def scale(spec: ScaleSpec) -> ScaleSpec:
        return ScaleSpec(log2=-2.0, mantissa=1.25, per_head=spec.per_head)
    if isinstance(case, MlaCase):
        return replace(case, scale=scale(case.scale))
    return replace(case, k_scale=scale(case.k_scale), v_scale=scale(case.v_scale))


def _pool_view(case, value):
    return replace(case, cache_place=_POOL_VIEW, **({"kv_form": "split"} if isinstance(case, FlashCase) else {}))


# (axis, value) -> a setter for the values ``Axis.set`` leaves to the strategies
EXTRA_SETTERS = {
    ("inputs", "strided"): _strided,
    ("scale", "other"): _other_scale,
    ("cache layout", "view into a pool"): _pool_view,
    ("cache order", "other"): lambda case, value: replace(case, cache_order=(1, 0, 2)),
}


def _set(axis: Axis, case, value: str):
    moved = axis.set(case, value)
    extra = EXTRA_SETTERS.get((axis.name, value))
    if moved is None and extra is not None and axis.of(case) is not None:
        moved = extra(case, value)
    return moved if moved is not None and axis.of(moved) == value else None


def _dimension(case, dimension: str) -> int:
    if dimension == "rotary_dim" and not isinstance(case, MlaCase):
        return case.table.rotary_dim
    if dimension == "table_rows":
        return case.table.max_position
    return getattr(case, dimension)


def _second_size(case, dimension: str, size: int):
    """A product's second dimension set on a crossing's case (the first is the crossing)."""
    if dimension == "heads" and isinstance(case, FlashCase):
        return replace(case, heads=size * case.kv_heads)
    if dimension == "kv_heads" and isinstance(case, FlashCase):
        return replace(case, heads=size, kv_heads=size)
    return replace(case, **{dimension: size})


def _sized(operation: str, level: Level, seed: int):
    # the crossing of the dimension with more to it (a rotary width, a head size, tokens) first
    (first, size), *rest = sorted(level.sizes, key=lambda item: item[0] in ("heads", "kv_heads"))
    case = boundaries.crossing_case(operation, first, size, seed)
    for dimension, other in rest:
        case = _second_size(case, dimension, other)
    return case


def _minimal(operation: str, seed: int):
    return boundaries.crossing_case(operation, "tokens", 3, seed)


@dataclasses.dataclass(frozen=True)
class Design:
    """An operation's parameters and size levels, computed once for the functions below."""

    operation: str
    levels: tuple[Level, ...]
    parameters: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, operation: str) -> "Design":
        return cls(operation, size_levels(operation), parameters(operation))


def build(design: Design, row: dict[str, str], seed: int = 1):
    """The case ``row`` describes (parameters it leaves out keep the crossing's minimal value), or
    None where its values cannot meet in one case."""
    level = next((level for level in design.levels if level.name == row.get(SIZE)), None)
    case = _sized(design.operation, level, seed) if level else _minimal(design.operation, seed)
    axes = [axis for axis in AXES if axis.name in row]
    for axis in axes:
        case = _set(axis, case, row[axis.name])
        if case is None:
            return None
    held = all(axis.of(case) == row[axis.name] for axis in axes)
    sized = level is None or all(_dimension(case, d) == size for d, size in level.sizes)
    return case if held and sized and _consistent(case) else None


def _consistent(case) -> bool:
    """What the contract requires of a case's sizes (GQA: H a multiple of Hkv; R <= D)."""
    if isinstance(case, FlashCase):
        return case.heads % case.kv_heads == 0 and case.table.rotary_dim <= case.head_size
    if isinstance(case, RopeCase):
        return case.table.rotary_dim <= case.head_size
    return True


# ---------------------------------------------------------------- coverage


def values_of(case, design: Design) -> dict[str, str]:
    """The case's value of each parameter of the design that applies to it."""
    names = design.parameters
    found = {}
    for level in reversed(design.levels):  # the most specific first: kv_heads 17 sets heads 17 too
        if all(_dimension(case, d) == size for d, size in level.sizes):
            found[SIZE] = level.name
            break
    for axis in AXES:
        value = axis.of(case) if axis.name in names else None
        if value is not None and value in names[axis.name]:
            found[axis.name] = value
    return found


def pairs_held(values: dict[str, str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return set(itertools.combinations(sorted(values.items()), 2))


def starting_row(design: Design, pair) -> dict[str, str] | None:
    """The smallest row holding ``pair`` that builds: the pair alone, or with one more parameter
    value that lets it apply (a scale needs an fp8 cache; a float32 cache, float32 inputs)."""
    row = dict(pair)
    if build(design, row) is not None:
        return row
    for name, values in design.parameters.items():
        for value in values if name in ENABLING_AXES and name not in row else ():
            if build(design, dict(row, **{name: value})) is not None:
                return dict(row, **{name: value})
    return None


def feasible_pairs(design: Design) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """Every pair of parameter values (sorted) that one case of the design can hold."""
    items = sorted((name, value) for name, values in design.parameters.items() for value in values)
    return [(a, b) for a, b in itertools.combinations(items, 2)
            if a[0] != b[0] and starting_row(design, (a, b)) is not None]


def pair_coverage(cases, operation: str) -> dict:
    """``{"strength": 2, "covered": N, "total": M, "missing": [...]}``: of the ``M`` pairs of
    parameter values one case of ``operation`` can hold, ``N`` are held by some of ``cases``;
    ``missing`` lists the others as ``"size heads 129 + kv_cache_dtype fp8"``."""
    design = Design.of(operation)
    held = set()
    for case in cases:
        held |= pairs_held(values_of(case, design))
    total = feasible_pairs(design)
    missing = [f"{a[0]} {a[1]} + {b[0]} {b[1]}" for a, b in total if (a, b) not in held]
    return {"strength": 2, "covered": len(total) - len(missing), "total": len(total), "missing": missing}


def committed_rows(operation: str) -> list[dict[str, str]]:
    """The covering array of ``operation`` as committed in ``interaction_rows.json``."""
    rows = json.loads(ROWS_FILE.read_text())["rows"][operation]
    return [dict(row) for row in rows]


def committed_pairs(operation: str) -> int:
    """How many feasible pairs of parameter values the committed covering array of ``operation``
    holds: all of them (``tests/test_interactions.py``), counted when the rows were generated."""
    return json.loads(ROWS_FILE.read_text())["pairs"][operation]


def interaction_cases(operation: str) -> list:
    """The committed covering array of ``operation`` as cases."""
    design, cases = Design.of(operation), []
    for seed, row in enumerate(committed_rows(operation), start=1):
        case = build(design, row, seed)
        if case is None:
            raise ValueError(f"interaction_rows.json: row {seed} of {operation} no longer builds: "
                             "regenerate it with `python ci/generate_interactions.py`")
        cases.append(case)
    return cases


def cover_rows(operation: str) -> list[dict[str, str]]:
    """A covering array of strength 2 over ``parameters(operation)`` (``covering.cover``): what
    ``ci/generate_interactions.py`` commits in ``interaction_rows.json``."""
    design = Design.of(operation)
    return covering.cover(design.parameters, lambda row: build(design, row),
                          lambda case: pairs_held(values_of(case, design)), feasible_pairs(design),
                          lambda pair: starting_row(design, pair))
