"""The HTML report's sections about cells: how far the conformance map got (``map_text``, also in
summary.md), the failing cells of the conformance map (a table, then each cell in full), the baseline (which cells are new, known, now passing) and the
implementations side by side (``comparison.json``, written by ``mla-fuse compare``)."""

from __future__ import annotations

from mla_fuse_conformance.commands.conformance_map.identity import cut_short_note
from mla_fuse_conformance.commands.report.markup import section, table, text

RESULTS = ("pass", "fail", "crash", "hang", "outside declared limits")
DIFFERENCES = ("cases", "max_ulps", "max_fp8_codes", "passthrough_bytes", "cache_bytes")


def rate_text(rate) -> str:
    """``k/n`` (failing among random cases inside the cell), or why there is none."""
    return f"{rate[0]}/{rate[1]}" if rate and len(rate) == 2 and rate[1] else "not measured"


STOPPED_BY = {"off": "no map was asked for (--map-rounds 0 or --map-seconds 0)",
              "budget": "the map's time budget (--map-seconds) was spent",
              "SIGTERM": "the map was stopped by SIGTERM", "SIGINT": "the map was stopped by SIGINT"}


def map_text(phase: dict | None) -> str | None:
    """report.json's ``run.map`` in one line: ``1 of 3 failing properties mapped; the map was stopped by
    SIGTERM; not mapped: P, Q``; None where every failing property was mapped (or no report says)."""
    if not phase or (not phase.get("not_mapped") and phase.get("stopped") in (None, "off") and not phase.get("running")):
        return None
    why = "the map is still running (or its process was killed)" if phase.get("running") else \
        STOPPED_BY.get(phase.get("stopped"), "")
    return (f"{phase.get('mapped')} of {phase.get('properties')} failing properties mapped" + (f"; {why}" if why else "")
            + (f"; not mapped: {', '.join(phase['not_mapped'])}" if phase.get("not_mapped") else "")
            + ("; declared limits not all checked" if phase.get("stopped") not in (None, "off")
               and not phase.get("limits_checked") else ""))


def baseline_mark(report: dict, cell: dict) -> str:
    """``new`` or ``known`` against the report's baseline, or "" without one."""
    found = report.get("baseline")
    if not found and cell.get("known") is None:
        return ""
    known = cell.get("known") if cell.get("known") is not None else cell.get("id") in (found.get("known") or [])
    return "known" if known else "new"


def cell_link(report: dict, cell_id: str | None) -> str:
    ids = [cell.get("id") for cell in report.get("cells") or []]
    if cell_id is None:
        return ""
    if cell_id not in ids:
        return text(cell_id)
    return f'<a href="#cell-{ids.index(cell_id)}">{text(cell_id)}</a> '


def cells(report: dict) -> str:
    """The failing cells: one table row each, then each in full."""
    found = report.get("cells") or []
    if not found:
        note = "No failing cell." if report.get("verdict") == "PASS" or not report.get("failures") else \
            "No failing cell was mapped (see the failures)."
        return section("cells", "Failing cells", f'<p class="note">{note}</p>')
    marks = [baseline_mark(report, cell) for cell in found]
    rows = [[f'<a href="#cell-{index}">{index + 1}</a>', text(", ".join(cell.get("operations") or [])),
             text(condition_text(cell)), text(cell.get("kind")),
             (' class="rate"', text(rate_text(cell.get("rate")))), text(cell.get("status")),
             *([(f' class="{mark}"', text(mark))] if any(marks) else [])]
            for index, (cell, mark) in enumerate(zip(found, marks))]
    attrs = [f' data-cell-id="{text(cell.get("id"))}"' + (f' data-baseline="{mark}"' if mark else "")
             + (f' data-cut-short="{text(cell["cut_short"])}"' if cell.get("cut_short") else "")
             for cell, mark in zip(found, marks)]
    headers = ["#", "operations", "condition", "kind", "fails", "status", *(["baseline"] if any(marks) else [])]
    summary = table(headers, rows, "cells-table", attrs)
    return section("cells", "Failing cells", summary + "".join(cell_detail(report, cell, index)
                                                              for index, cell in enumerate(found)))


def condition_text(cell: dict) -> str:
    """A cell's condition as text, and where its diagnosis was cut short (``identity.cut_short_note``)."""
    return f"{(cell.get('condition') or {}).get('text')}{cut_short_note(cell.get('cut_short'))}"


def cell_detail(report: dict, cell: dict, index: int) -> str:
    condition, replay = cell.get("condition") or {}, cell.get("replay") or {}
    features = ", ".join(f"{axis} {value}" for axis, value in (condition.get("features") or {}).items())
    rows = [("id", text(cell.get("id"))), ("property", text(cell.get("property"))),
            ("condition", text(condition_text(cell))), ("feature values", text(features or ("none shown" if cell.get("cut_short") else "(any case)"))),
            ("kind", text(cell.get("kind"))), ("error", f'<pre class="error">{text(cell.get("error"))}</pre>'),
            ("worst elements", worst(cell.get("worst"))),
            ("fails", f"{text(rate_text(cell.get('rate')))} random cases inside it"
                      + (f" ({text(cell.get('status'))})" if cell.get("status") else "")),
            ("pair one field apart", pair(cell.get("pair"))), ("source", text(cell.get("source"))),
            ("replay", f'<pre class="replay">{text(replay.get("command") or replay.get("file"))}</pre>'
                       + (f"reproduced on replay: {text(replay.get('reproduced'))}" if replay.get("reproduced")
                          is not None else "")),
            ("reproducer", reproducer(cell.get("reproducer"))), ("baseline", text(baseline_mark(report, cell)))]
    body = table([], [[text(name), value] for name, value in rows if value], f"cell-{index}-table")
    return (f'<section class="cell" id="cell-{index}" data-cell-id="{text(cell.get("id"))}">'
            f'<h3>{index + 1}. {text(cell.get("property"))}: {text(condition_text(cell))}</h3>'
            f"{body}{fields(cell)}</section>")


def element(value, code) -> str:
    """A value as the comparison saw it: an fp8 code with its value (``-240 (code 0xf7 = 247)``)."""
    return f"{value} (code 0x{code:02x} = {code})" if isinstance(code, int) else str(value)


def worst(found: list | None) -> str:
    """The worst element of each failed check (report.json ``cells[].worst``): got against expected, decoded."""
    if not found:
        return ""
    rows = [[text(entry.get("check")), text(f"{entry.get('argument')}{entry.get('index')}"),
             text(element(entry.get("got"), entry.get("got_code"))),
             text(element(entry.get("expected"), entry.get("expected_code"))),
             text(f"{entry.get('failing')} of {entry.get('of')}")] for entry in found]
    return table(["check", "element", "got", "expected", "failing elements"], rows)


def pair(found: dict | None) -> str:
    if not found:
        return ""
    return (f"{text(found.get('field'))}: {text(found.get('failing'))} fails, {text(found.get('passing'))} passes"
            + (f" (failing case: {text(found.get('file'))})" if found.get("file") else ""))


def reproducer(found: dict | None) -> str:
    if not found:
        return ""
    return (f'<span class="reproducer">script: <code>{text(found.get("script"))}</code>'
            + (f', data: <code>{text(found.get("data"))}</code>' if found.get("data") else "")
            + f"; reproduced: {text(found.get('reproduced'))}; passes with the reference: "
              f"{text(found.get('passes_with_reference'))}</span>")


def fields(cell: dict) -> str:
    """The failing and passing values of each generated field, and the relations that split them."""
    rows = [[text(entry.get("field")), text(", ".join(map(str, entry.get("failing") or []))),
             text(", ".join(map(str, entry.get("passing") or []))), text(entry.get("explained_by"))]
            for entry in cell.get("fields") or []]
    relations = "".join(f"<li>{text(name)}: {text(value)}</li>" for name, value in (cell.get("relations") or {}).items())
    return ((table(["field", "failing values", "passing values", "explained by"], rows)
             if rows else "") + (f"<p>Relations of the failing case:</p><ul>{relations}</ul>" if relations else ""))


def baseline(report: dict) -> str:
    found = report.get("baseline")
    if not found:
        return ""
    lists = "".join(f'<h3>{text(title)} ({len(found.get(key) or [])})</h3><ul id="baseline-{key.replace("_", "-")}">'
                    + "".join(f"<li>{cell_link(report, cell_id)}</li>" for cell_id in found.get(key) or []) + "</ul>"
                    for key, title in (("new", "New"), ("known", "Known"), ("now_passing", "Now passing")))
    return section("baseline", "Baseline", f"<p>Against <code>{text(found.get('from'))}</code>.</p>{lists}")


def side_by_side(comparison: dict | None) -> str:
    """One table per operation: rows the cells, columns the implementations, then the differences
    between implementations that passed the same cases."""
    if not comparison:
        return ""
    specs = [entry.get("spec") for entry in comparison.get("implementations") or []]
    names = [f"{entry.get('spec')} ({entry.get('name')}, {entry.get('version') or 'version unknown'})"
             for entry in comparison.get("implementations") or []]
    body = (f"<p>{text(comparison.get('cases'))} cases per operation, {text(comparison.get('profile'))} profile; "
            f"implementations: {text('; '.join(names))}.</p>")
    operations = list(dict.fromkeys(row.get("operation") for row in comparison.get("rows") or []))
    for operation in operations:
        rows = [row for row in comparison.get("rows") or [] if row.get("operation") == operation]
        body += f"<h3>{text(operation)}</h3>" + table(
            ["cell", *map(str, specs)], [[text(row.get("cell")), *(results((row.get("results") or {}).get(spec))
                                                                  for spec in specs)] for row in rows],
            f"side-by-side-{text(operation)}", [f' data-cell="{text(row.get("cell"))}"' for row in rows])
        body += differences(rows)
    return section("side-by-side", "Implementations side by side", body)


def results(found: dict | None) -> str:
    if not found:
        return ""
    return text(" / ".join(f"{name} {found[name]}" for name in (*RESULTS, *sorted(set(found) - set(RESULTS)))
                           if found.get(name)) or "no case")


def differences(rows: list[dict]) -> str:
    found = [(row.get("cell"), entry) for row in rows for entry in row.get("differences") or []]
    if not found:
        return ""
    return "<p>Differences where both passed:</p><ul>" + "".join(
        f"<li>{text(cell)}: {text(entry.get('a'))} vs {text(entry.get('b'))}: "
        + text(", ".join(f"{key.replace('_', ' ')} {entry[key]}" for key in DIFFERENCES if key in entry)) + "</li>"
        for cell, entry in found) + "</ul>"
