"""A deterministic greedy covering array of strength 2 (all pairs), with constraints.

``cover(parameters, build, held, pairs)``: ``parameters`` maps each parameter to its values (in
order); ``build(row)`` returns a case for a partial row ``{parameter: value}`` or None where its
values cannot meet; ``held(case)`` gives the pairs a built case holds (a case may hold more than
its row asked for); ``pairs`` are the pairs to cover, each ``((parameter, value), (parameter,
value))`` sorted; ``start(pair)`` the row a new row starts from (the pair itself, or with a value
that lets it apply). Each new row starts from the first pair not yet held, then takes for every
other parameter, in order, the value that completes the most pairs not yet held with the values
chosen so far (ties: the earlier value), skipping values ``build`` rejects; a parameter may stay
unset. The same inputs give the same rows: no randomness, no dependency. A pair no row can hold
(rejected whatever the rest) ends the search for it and stays uncovered.
"""

from __future__ import annotations

from typing import Callable, Iterable

Pair = tuple[tuple[str, str], tuple[str, str]]


def _pair(a: tuple[str, str], b: tuple[str, str]) -> Pair:
    return (a, b) if a <= b else (b, a)


def _gain(row: dict[str, str], parameter: str, value: str, uncovered: set[Pair]) -> int:
    item = (parameter, value)
    return sum(_pair(item, chosen) in uncovered for chosen in row.items())


def _complete(row: dict[str, str], parameters: dict[str, tuple[str, ...]], build: Callable,
              uncovered: set[Pair]) -> dict[str, str]:
    """Fill the parameters ``row`` leaves out, greedily, keeping it buildable."""
    for parameter, values in parameters.items():
        if parameter in row:
            continue
        ranked = sorted(range(len(values)), key=lambda i: (-_gain(row, parameter, values[i], uncovered), i))
        for index in ranked:
            candidate = dict(row, **{parameter: values[index]})
            if build(candidate) is not None:
                row = candidate
                break
    return row


def cover(parameters: dict[str, tuple[str, ...]], build: Callable, held: Callable, pairs: Iterable[Pair],
          start: Callable = dict) -> list[dict[str, str]]:
    """Rows (``{parameter: value}``, in ``parameters`` order) whose cases hold every pair of ``pairs``
    that some row can hold."""
    pairs = list(pairs)
    uncovered = set(pairs)
    rows = []
    for pair in pairs:
        if pair not in uncovered:
            continue
        first = start(pair)
        if first is None or build(first) is None:
            uncovered.discard(pair)
            continue
        row = _complete(first, parameters, build, uncovered)
        uncovered -= held(build(row))
        uncovered.discard(pair)  # held now, or unreachable with the rest of any row
        rows.append({name: row[name] for name in parameters if name in row})
    return rows
