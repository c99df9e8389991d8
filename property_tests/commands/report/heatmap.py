"""The HTML report's pictures, as inline SVG: the conformance map as a heat map of operation x
feature value, and one coloured square per named deployment.

A heat map square (operation, feature value) is coloured by the failure rate of the failing
cells of that operation whose condition admits that value (``admits``: the failing case moved to
the value stays inside the condition; a value that fails somewhere is never green): failing /
tried, summed over those cells' ``rate``s (random cases drawn inside each cell). Green: no failing cell has the value
and examples had it; grey: no example had it; dark red: failing cells whose rate was not
measured. Each square has a ``<title>`` (the browser's tooltip) and ``data-`` attributes with
the same numbers.
"""

from __future__ import annotations

import dataclasses
from html import escape

SIZE, GAP, LABEL_WIDTH, LABEL_HEIGHT = 16, 6, 210, 160
PASSING, NO_EXAMPLE, UNMEASURED = "#a6d96a", "#d9d9d9", "#67000d"
VERDICT_COLOURS = {"pass": PASSING, "fail": "#e34a33", "crash": "#67000d", "hang": "#7a0177",
                   "not supported (declared)": NO_EXAMPLE, "skipped": NO_EXAMPLE}


@dataclasses.dataclass(frozen=True)
class Square:
    operation: str
    axis: str
    value: str
    failing: int  # failing cases among ``tried``, over the cells with this value
    tried: int
    cells: int  # failing cells of the operation with this value
    examples: int | None  # examples with this value (of this operation where known), None: unknown

    @property
    def colour(self) -> str:
        if self.cells:
            return rate_colour(self.failing / self.tried) if self.tried else UNMEASURED
        return PASSING if self.examples else NO_EXAMPLE

    def text(self) -> str:
        examples = "examples unknown" if self.examples is None else f"{self.examples} examples"
        if not self.cells:
            return f"{self.operation}, {self.axis} {self.value}: no failing cell, {examples}"
        rate = f"fails {self.failing}/{self.tried}" if self.tried else "fails (rate not measured)"
        return f"{self.operation}, {self.axis} {self.value}: {rate} in {self.cells} failing cell(s), {examples}"


def rate_colour(rate: float) -> str:
    """Yellow (a small share of the cases fail) to red (every case fails)."""
    low, high = (254, 204, 92), (189, 0, 38)
    return "#" + "".join(f"{round(a + (b - a) * rate):02x}" for a, b in zip(low, high))


def columns(report: dict) -> list[tuple[str, str]]:
    """(axis, value) in ``coverage.axes``'s order (the declared axes'), then those only the cells name."""
    found = [(axis, value) for axis, values in ((report.get("coverage") or {}).get("axes") or {}).items()
             for value in values]
    for cell in report.get("cells") or []:
        for axis, value in ((cell.get("condition") or {}).get("features") or {}).items():
            if (axis, str(value)) not in found:
                found.append((axis, str(value)))
    return found


def squares(report: dict, operations: list[str], per_operation: dict) -> list[list[Square]]:
    """One row per operation; examples per value from ``per_operation`` (outcomes.jsonl) where it
    has the operation, else from ``coverage.axes`` (all operations together)."""
    overall = (report.get("coverage") or {}).get("axes") or {}
    rows = []
    for operation in operations:
        counts = per_operation.get(operation, overall if not per_operation else {})
        known = bool(counts) or bool(overall)
        row = []
        for axis, value in columns(report):
            inside = [cell for cell in report.get("cells") or [] if operation in (cell.get("operations") or [])
                      and admits(cell, axis, value)]
            rates = [cell["rate"] for cell in inside if cell.get("rate") and cell["rate"][1]]
            examples = (counts.get(axis) or {}).get(value, 0) if known else None
            row.append(Square(operation, axis, value, sum(r[0] for r in rates), sum(r[1] for r in rates),
                              len(inside), examples))
        rows.append(row)
    return rows


def admits(cell: dict, axis: str, value: str) -> bool:
    """Whether ``cell``'s condition admits ``axis value``: by its ``admits`` (the failing case moved to
    the value stays inside the condition, ``conformance_map/admits.py``; an axis its cases lack admits
    nothing); a report written before cells had ``admits``: by its feature values, as then."""
    if cell.get("admits") is not None:
        return value in cell["admits"].get(axis, ())
    return str(((cell.get("condition") or {}).get("features") or {}).get(axis)) == value


def heat_map(report: dict, operations: list[str], per_operation: dict) -> str:
    """The conformance map as an inline SVG (rows: operations; columns: feature values, grouped by axis)."""
    grid = squares(report, operations, per_operation)
    if not grid or not grid[0]:
        return '<p class="note">No feature values were recorded: no heat map.</p>'
    xs, x, axis = [], LABEL_WIDTH, grid[0][0].axis
    for square in grid[0]:
        x += GAP if square.axis != axis else 0
        xs.append(x)
        x, axis = x + SIZE, square.axis
    height = LABEL_HEIGHT + SIZE * len(grid) + 4
    parts = [f'<svg id="heatmap" xmlns="http://www.w3.org/2000/svg" width="{x + LABEL_HEIGHT * 0.6}" height="{height}" '
             f'role="img" aria-label="failure rate per operation and feature value">']
    for square, left in zip(grid[0], xs):
        parts.append(f'<text class="column" x="{left + SIZE / 2}" y="{LABEL_HEIGHT - 4}" '
                     f'transform="rotate(-60 {left + SIZE / 2} {LABEL_HEIGHT - 4})">'
                     f'{escape(square.axis)} {escape(square.value)}</text>')
    for index, row in enumerate(grid):
        top = LABEL_HEIGHT + index * SIZE
        parts.append(f'<text class="row" x="{LABEL_WIDTH - 6}" y="{top + SIZE - 3}" text-anchor="end">'
                     f'{escape(row[0].operation)}</text>')
        parts += [square_rect(square, left, top) for square, left in zip(row, xs)]
    parts.append("</svg>")
    return "".join(parts)


def square_rect(square: Square, left: int, top: int) -> str:
    rate = f"{square.failing}/{square.tried}" if square.tried else ""
    return (f'<rect x="{left}" y="{top}" width="{SIZE - 1}" height="{SIZE - 1}" fill="{square.colour}" '
            f'data-operation="{escape(square.operation)}" data-axis="{escape(square.axis)}" '
            f'data-value="{escape(square.value)}" data-cells="{square.cells}" data-rate="{rate}">'
            f'<title>{escape(square.text())}</title></rect>')


def legend() -> str:
    entries = [(PASSING, "no failing cell"), (rate_colour(0.0), "a few cases fail"),
               (rate_colour(0.5), "half fail"), (rate_colour(1.0), "every case fails"),
               (UNMEASURED, "fails, rate not measured"), (NO_EXAMPLE, "no example")]
    return '<p class="legend" id="heatmap-legend">' + "".join(
        f'<span><svg width="12" height="12"><rect width="12" height="12" fill="{colour}"/></svg> {escape(text)}</span>'
        for colour, text in entries) + "</p>"


def deployment_strip(deployments: list[dict]) -> str:
    """One square per deployment, coloured by its verdict, in the order of the table."""
    if not deployments:
        return ""
    parts = [f'<svg id="deployment-strip" xmlns="http://www.w3.org/2000/svg" width="{len(deployments) * SIZE + 2}" '
             f'height="{SIZE + 2}" role="img" aria-label="deployment verdicts">']
    for index, entry in enumerate(deployments):
        verdict = str(entry.get("verdict"))
        parts.append(f'<rect x="{index * SIZE}" y="1" width="{SIZE - 2}" height="{SIZE - 2}" '
                     f'fill="{VERDICT_COLOURS.get(verdict, UNMEASURED)}" data-verdict="{escape(verdict)}">'
                     f'<title>{escape(str(entry.get("name")))} ({escape(str(entry.get("operation")))}): '
                     f'{escape(verdict)}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)
