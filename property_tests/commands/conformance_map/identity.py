"""What makes two failing cells the same cell: the property, the kind of failure without what varies
between runs, and the condition (``cell_id``, the id ``--baseline`` and known-failures files hold);
and the words every view adds to a cell whose diagnosis the map's time budget cut short
(``cut_short_note``: ``cut_short.py``), which is no known cell's (it has no id in ``failing``)."""

from __future__ import annotations


def kind_class(kind: str) -> str:
    """A failure's kind without what varies between runs: ``wrong result``, ``raised TYPE``,
    ``crashed (SIGNAL)``, ``hung``; a replay note (``, not the same on replay``) is dropped."""
    kind = kind.partition(", not the same on replay")[0]
    return "hung" if kind.startswith("hung") else kind


def cell_id(property_name: str, kind: str, condition: str) -> str:
    return f"{property_name} | {kind_class(kind)} | {condition}"


def cut_short_note(step: str | None) -> str:
    """`` (diagnosis cut short by the map's time budget while STEP)``; "" for a cell diagnosed to the end."""
    return f" (diagnosis cut short by the map's time budget while {step})" if step else ""


def kind_family(kind: str) -> str:
    """How two failures' kinds compare: ``raised TYPE``, ``hung``, or ``wrong result or crashed`` (a
    crash seen by the test runner carries no signal, the map's does; ``baseline.match_key``)."""
    kind = kind_class(kind)
    return "wrong result or crashed" if kind == "wrong result" or kind.startswith("crashed") else kind
