"""``report.html``: one self-contained page made from a report directory's ``report.json``
(docs/REPORT.md), with ``comparison.json`` where ``mla-fuse compare`` wrote one.

Standard library only: the markup is built as strings with every value passed through
``html.escape``; inline CSS, inline SVG (``heatmap.py``), no script, nothing fetched, so the
page opens from a CI artifact as it is. Sections: the verdict, what ran and the environment, one
row per operation, the conformance map as a heat map, the failing cells (``cells.py``:
each with its rate, its passing and failing values, its replay command and its reproducer), the
deployments, the failures, the declarations, the declared limits, the coverage, the baseline and
the implementations side by side. What a test looks for has a stable ``id`` or ``data-`` attribute:
``<tr data-cell-id="...">`` with ``<td class="rate">3/5</td>``, ``<td id="cpu-flags">``,
``<td data-version="torch">``.
"""

from __future__ import annotations

import pathlib

from mla_fuse_conformance.commands.report import cells
from mla_fuse_conformance.commands.report.defects import count_line

from mla_fuse_conformance.commands.report import heatmap

from mla_fuse_conformance.commands.report import sources
from mla_fuse_conformance.commands.report.markup import STYLE, section, table, text
from mla_fuse_conformance.declarations.operations import OPERATIONS
from mla_fuse_conformance.running import recording

PAGE_FILE = "report.html"
VERSIONS = ("python", "torch", "triton", "hypothesis", "mla_fuse")


def header(report: dict) -> str:
    """The verdict, then what ran and the environment side by side."""
    run, described = report.get("run") or {}, report.get("implementation") or {}
    verdict = str(report.get("verdict", "?"))
    rows = [("implementation", f"{described.get('spec')} ({described.get('name')})"),
            ("version", described.get("version") or "unknown"), ("profile", run.get("profile")),
            ("seed policy", run.get("seed_policy")), ("started", run.get("started")),
            ("duration", f"{run.get('seconds')} s" + phases(run.get("phases"))), ("command", run.get("command")),
            ("directory", run.get("cwd")), ("conformance map", cells.map_text(run.get("map"))),
            ("exit status", f"{run.get('exit_code')} (pytest {run.get('pytest_exit_code')})")]
    counted = (f' <span id="defect-count">{text(count_line(report["defects"], report.get("cells") or []))}</span>'
               if report.get("defects") else "")
    return (f'<h1>mla-fuse verify: {text(described.get("spec"))} '
            f'<span id="verdict" class="verdict {text(verdict)}">{text(verdict)}</span>{counted}</h1><div class="top">'
            + section("what-ran", "What ran", table([], [[text(name), text(value)] for name, value in rows
                                                         if value is not None], "what-ran-table"))
            + environment(report) + "</div>")


def phases(found: dict | None) -> str:
    return f" ({', '.join(f'{name} {seconds} s' for name, seconds in found.items())})" if found else ""


def schema_note(report: dict) -> str:
    if report.get("schema", 2) >= 2:
        return ""
    return (f'<p class="note" id="schema-note">A schema 1 report (written by an earlier version of verify): it holds '
            f'no {", no ".join(report.get("missing") or [])}. Re-run <code>mla-fuse verify</code> for them.</p>')


def environment(report: dict) -> str:
    found = report.get("environment")
    if not found:
        return ""
    where, cpu = found.get("device") or {}, found.get("cpu") or {}
    capability = f", compute capability {where['compute_capability']}" if where.get("compute_capability") else ""
    flags = " ".join(f'<code class="flag">{text(flag)}</code>' for flag in cpu.get("flags") or []) or "none found"
    backend = "Triton's interpreter" if found.get("backend") == "interpreter" else found.get("backend")
    rows = [[text(name), (f' data-version="{text(name)}"', text(found.get(name) or "not installed"))]
            for name in VERSIONS]
    rows += [["platform", text(found.get("platform"))], ["backend", text(backend)],
             ["device", text(f"{where.get('kind')} x{where.get('count')} ({where.get('name')}{capability})")],
             ["CPU", text(cpu.get("model"))], ["CPU vector flags", (' id="cpu-flags"', flags)]]
    return section("environment", "Environment", table([], rows, "environment-table"))


def declarations(report: dict) -> str:
    described = report.get("implementation") or {}
    declared = described.get("declaration") or {}
    lines = "".join(f"<li>{text(line)}</li>" for line in declared.get("lines") or [])
    signatures = described.get("signatures") or {}
    checked = "".join(f"<li>{text(op)}: {text(how)}</li>" for op, how in signatures.items())
    return section("declarations", "Declarations", f"<ul>{lines}</ul>"
                   + (f"<p>Signatures:</p><ul>{checked}</ul>" if checked else ""))


def operations(report: dict) -> str:
    found = report.get("operations") or {}
    names = [op for op in OPERATIONS if op in found]
    others = [name for name in found if name not in OPERATIONS]
    keys = ("examples", "worst_rope_bound_fraction", "worst_rope_ulps", "worst_fp8_code_diff", "padded_slot_cases",
            "saturation_cases", "passed", "failed", "skipped", "verdict")
    headers = ["operation", "examples", "rope bound used", "rope ulps", "fp8 codes", "padded", "saturated",
               "passed", "failed", "skipped", "verdict"]
    rows = [[text(op), *(text(number(found[op].get(key))) for key in keys)] for op in names]
    attrs = [f' data-operation="{text(op)}" class="{text(found[op].get("verdict"))}"' for op in names]
    other_rows = [[text(name), *(text(number(found[name].get(key))) for key in ("passed", "failed", "skipped",
                                                                               "verdict"))] for name in others]
    other_attrs = [f' data-check="{text(name)}" class="{text(found[name].get("verdict"))}"' for name in others]
    return (section("operations", "Operations", table(headers, rows, "operations-table", attrs))
            + (section("other-checks", "Other checks (no one operation's examples)",
                       table(["check", "passed", "failed", "skipped", "verdict"], other_rows, "other-checks-table",
                             other_attrs)) if others else ""))


def number(value):
    return f"{value:.3g}" if isinstance(value, float) else value


def conformance_map(report: dict, per_operation: dict) -> str:
    found = report.get("operations") or {}
    provided = ((report.get("implementation") or {}).get("declaration") or {}).get("provides") or []
    rows = [op for op in OPERATIONS if op in found or op in provided]
    body = ('<p>Failure rate per operation and feature value: failing / tried random cases inside the failing cells '
            'whose condition has that value (hover a square for its numbers).</p>'
            f'<div class="scroll">{heatmap.heat_map(report, rows, per_operation)}</div>{heatmap.legend()}')
    return section("conformance-map", "Conformance map", body)


def defects(report: dict) -> str:
    """One row per defect: the widest condition, the kind, its cells (links), the properties and operations."""
    found = report.get("defects") or []
    if not found:
        return ""
    rows = [[text(entry.get("condition")), text(entry.get("kind")),
             ", ".join(cells.cell_link(report, cell) for cell in entry.get("cells") or []),
             text(", ".join(entry.get("properties") or [])), text(", ".join(entry.get("operations") or []))]
            for entry in found]
    return section("defects", f"Defects ({len(found)})",
                   '<p class="note">Failing cells with the same condition, or where one implies the other, across '
                   'properties and operations, are one defect (docs/REPORT.md "defects").</p>'
                   + table(["condition", "kind", "cells", "properties", "operations"], rows, "defects-table"))


def deployments(report: dict) -> str:
    found = report.get("deployments")
    if found is None:
        return ""
    if not found:
        return section("deployments", "Deployments", '<p class="note">No deployment test ran.</p>')
    rows = [[text(entry.get("name")), text(entry.get("operation")), text(entry.get("source")),
             cells.cell_link(report, entry.get("cell")) + text(entry.get("reason")),
             text(entry.get("seconds")), text(entry.get("verdict"))] for entry in found]
    attrs = [f' data-deployment="{text(entry.get("name"))}" class="{text(entry.get("verdict"))}"' for entry in found]
    return section("deployments", "Deployments", heatmap.deployment_strip(found)
                   + table(["deployment", "operation", "source", "cell / reason", "seconds", "verdict"],
                           rows, "deployments-table", attrs))


def failures(report: dict) -> str:
    found = report.get("failures") or []
    if not found:
        return ""
    rows = [[text(failure.get("property")), text(failure.get("kind")),
             text(", ".join(f"{axis} {value}" for axis, value in (failure.get("features") or {}).items())),
             f'<pre>{text(((failure.get("replay") or {}).get("command")) or failure.get("file"))}</pre>']
            for failure in found]
    return section("failures", "Failures", table(["property", "kind", "features", "replay"], rows, "failures-table"))


def limits(report: dict) -> str:
    found = report.get("limits") or []
    if not found:
        return ""
    keys = ("operation", "axis", "value", "outcome", "detail", "guarded_by")
    rows = [[text(check.get(key)) for key in keys] for check in found]
    return section("limits", "Declared limits, checked",
                   table(["operation", "axis", "value", "outcome", "detail", "guarded by its caller"], rows,
                         "limits-table"))


def coverage(report: dict) -> str:
    found = report.get("coverage")
    if not found:
        return ""
    axes = [[text(axis), ", ".join(f'<span class="{"zero" if not count else ""}">{text(value)} {text(count)}</span>'
                                   for value, count in values.items())] for axis, values in found.get("axes", {}).items()]
    events = ", ".join(f"{text(event)} {text(count)}" for event, count in (found.get("events") or {}).items())
    runs = found.get("deployments") or {}
    pairs = "".join(f"<li>{text(op)}: all {text(entry.get('pairs'))} feasible pairs in {text(entry.get('cases'))} "
                    f"cases (strength {text(entry.get('strength'))}): {text(entry.get('outcome'))}</li>"
                    for op, entry in (found.get("pairs") or {}).items())
    body = (f'<p id="coverage-events">Events: {events}</p><p>Deployments: '
            + ", ".join(f"{text(name)} {text(count)}" for name, count in runs.items()) + "</p>"
            + (f"<p>Interactions:</p><ul>{pairs}</ul>" if pairs else "")
            + "<p>Examples per feature value (0: declared, exercised by no example):</p>"
            + table(["axis", "values"], axes, "coverage-axes"))
    return section("coverage", "Coverage", body)


def render(report: dict | None, comparison: dict | None = None, per_operation: dict | None = None) -> str:
    """The page for ``report`` (None: only the side-by-side table of ``comparison``)."""
    if report is None:
        title, parts = "mla-fuse compare", ["<h1>mla-fuse compare</h1>"]
    else:
        title = f"mla-fuse verify: {(report.get('implementation') or {}).get('spec')}: {report.get('verdict')}"
        parts = [header(report), schema_note(report), operations(report), conformance_map(report, per_operation or {}),
                 defects(report), cells.cells(report), deployments(report), failures(report), declarations(report),
                 limits(report), coverage(report), cells.baseline(report)]
    parts.append(cells.side_by_side(comparison))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{text(title)}</title>'
            f'<style>{STYLE}</style></head><body>{"".join(parts)}</body></html>\n')


def write(report_dir: pathlib.Path) -> pathlib.Path:
    """Render ``report_dir/report.html`` from the report directory's files; return its path."""
    report_dir = pathlib.Path(report_dir)
    report, comparison = sources.load(report_dir), sources.comparison(report_dir)
    if report is None and comparison is None:
        raise FileNotFoundError(f"{report_dir} holds neither {sources.REPORT_FILE} nor "
                                f"{sources.COMPARISON_FILE}")
    spec = ((report or {}).get("implementation") or {}).get("spec")
    per_operation = sources.examples_per_operation(report_dir, spec)
    path = report_dir / PAGE_FILE
    recording.write_atomic(path, render(report, comparison, per_operation))
    return path
