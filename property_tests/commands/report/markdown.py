"""``summary.md``: a report directory's ``report.json`` as a short GitHub-flavoured Markdown
summary, fit for ``$GITHUB_STEP_SUMMARY``: the verdict, what ran, one row per operation, the
failing cells with their rates and replay commands, then what the first cells got wrong (the
worst elements, decoded: ``-240 (code 0xf7 = 247)``), the deployments counted, and what is new
against a baseline. A long list is cut to ``MAX_ROWS`` rows with a pointer to ``report.html``,
so a big report stays near 60 lines.
"""

from __future__ import annotations

import collections
import pathlib

from mla_fuse_conformance.commands.report import sources
from mla_fuse_conformance.commands.report.cells import baseline_mark, condition_text, map_text, rate_text
from mla_fuse_conformance.commands.report.defects import count_line
from mla_fuse_conformance.declarations.operations import OPERATIONS
from mla_fuse_conformance.running import recording
from mla_fuse_conformance.running.failure_text import worst_lines

SUMMARY_FILE = "summary.md"
MAX_ROWS = 12
MAX_ERRORS, ERROR_LINES = 3, 3  # the cells whose error is shown, and its lines each


def cell(value) -> str:
    """``value`` as one Markdown table cell (no newline, no column break)."""
    return " ".join(str("" if value is None else value).split()).replace("|", "\\|")


def code(value) -> str:
    return f"`{value}`" if value else ""


def rows(headers: list[str], found: list[list], total: int) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in found[:MAX_ROWS]]
    if total > MAX_ROWS:
        lines.append(f"\n... {total - MAX_ROWS} more, see report.html")
    return lines


def what_ran(report: dict) -> list[str]:
    run, described, found = report.get("run") or {}, report.get("implementation") or {}, report.get("environment")
    counted = f": {count_line(report['defects'], report.get('cells') or [])}" if report.get("defects") else ""
    lines = [f"## mla-fuse verify: {described.get('spec')}: **{report.get('verdict')}**{counted}", "",
             f"{described.get('name')} version {described.get('version') or 'unknown'}, {run.get('profile')} profile, "
             f"{run.get('seconds')} s" + (f", started {run['started']}" if run.get("started") else "")]
    if found:
        versions = ", ".join(f"{name} {found.get(name)}" for name in ("python", "torch", "triton", "hypothesis",
                                                                     "mla_fuse"))
        cpu = found.get("cpu") or {}
        lines.append(f"{versions}; {(found.get('device') or {}).get('name')}; CPU flags: "
                     f"{' '.join(cpu.get('flags') or []) or 'none found'}")
    elif report.get("schema", 2) < 2:
        lines.append("(schema 1 report: no environment, coverage or deployments; re-run `mla-fuse verify` for them)")
    if map_text(run.get("map")):
        lines += ["", f"**Conformance map:** {map_text(run['map'])}"]
    return [*lines, ""]


def operations(report: dict) -> list[str]:
    found = report.get("operations") or {}
    names = [op for op in OPERATIONS if op in found]
    table = [[op, found[op].get("examples"), found[op].get("passed"), found[op].get("failed"),
              found[op].get("skipped"), found[op].get("verdict")] for op in names]
    others = [[name, found[name].get("passed"), found[name].get("failed"), found[name].get("skipped"),
               found[name].get("verdict")] for name in found if name not in OPERATIONS]
    return [*rows(["operation", "examples", "passed", "failed", "skipped", "verdict"], table, len(table)), "",
            *([*rows(["other check", "passed", "failed", "skipped", "verdict"], others, len(others)), ""]
              if others else [])]


def defects(report: dict) -> list[str]:
    """One row per defect (docs/REPORT.md "defects"): its widest condition, kind, and what it breaks."""
    found = report.get("defects") or []
    if not found:
        return []
    table = [[entry.get("condition"), entry.get("kind"), len(entry.get("cells") or []),
              ", ".join(entry.get("properties") or []), ", ".join(entry.get("operations") or [])] for entry in found]
    return [f"### Defects ({len(found)})", "",
            *rows(["condition", "kind", "cells", "properties", "operations"], table, len(table)), ""]


def cells(report: dict) -> list[str]:
    found = report.get("cells") or []
    if not found:
        return failures(report)
    marks = bool(report.get("baseline")) or any(entry.get("known") is not None for entry in found)
    table = [[", ".join(entry.get("operations") or []), condition_text(entry), entry.get("kind"),
              rate_text(entry.get("rate")), *([baseline_mark(report, entry)] if marks else []),
              code((entry.get("replay") or {}).get("command"))] for entry in found]
    headers = ["operations", "failing cell", "kind", "fails", *(["baseline"] if marks else []), "replay"]
    return [f"### Failing cells ({len(found)})", "", *rows(headers, table, len(table)), "", *errors(found)]


def errors(found: list[dict]) -> list[str]:
    """What the first ``MAX_ERRORS`` cells got wrong: the worst element of each failed check (else the
    error's first lines), in a fenced block, so nothing in it is read as Markdown."""
    lines = []
    for index, entry in enumerate(found[:MAX_ERRORS]):
        error = entry.get("error") or ""
        shown = worst_lines(error, ERROR_LINES) or error.strip().splitlines()[:ERROR_LINES]
        if not shown:
            continue
        fence = "`" * max(3, 1 + max((len(run) for run in "".join(c if c == "`" else " " for c in error).split()),
                                     default=0))
        title = f"{cell((entry.get('condition') or {}).get('text'))} ({cell(entry.get('kind'))})"
        lines += [f"Cell {index + 1}, {title}:", "",
                  fence + "text", *shown, fence, ""]
    if len(found) > MAX_ERRORS and lines:
        lines += [f"... the errors of {len(found) - MAX_ERRORS} more cells: see report.html", ""]
    return lines


def failures(report: dict) -> list[str]:
    """The failures as pytest saw them, where no cell was mapped (``--map-rounds 0``)."""
    found = report.get("failures") or []
    table = [[entry.get("property"), entry.get("kind"), code((entry.get("replay") or {}).get("command"))]
             for entry in found]
    return [f"### Failures ({len(found)})", "", *rows(["property", "kind", "replay"], table, len(table)), ""] \
        if found else []


def unguarded_limits(report: dict) -> list[str]:
    """Declared limits a case just outside ran past and did harm (docs/REPORT.md, ``limits``): findings."""
    found = [check for check in report.get("limits") or [] if str(check.get("outcome")).startswith("unguarded")]
    table = [[check.get("operation"), f"{check.get('axis')} {check.get('value')}", check.get("outcome"),
              check.get("detail"), check.get("guarded_by") or "no: a finding", code(replay_command(check.get("file")))]
             for check in found]
    return [f"### Unguarded declared limits ({len(found)})", "",
            *rows(["operation", "declared limit", "outcome", "detail", "guarded by its caller", "replay"], table,
                  len(table)), ""] if found else []


def replay_command(file: str | None) -> str | None:
    return recording.replay_command(pathlib.Path(file)) if file else None


def deployments(report: dict) -> list[str]:
    found = report.get("deployments")
    if not found:
        return []
    counted = collections.Counter(entry.get("verdict") for entry in found)
    held = {verdict: counted.pop(verdict) for verdict in ("not supported (declared)", "skipped") if verdict in counted}
    run = sum(counted.values())  # as the console counts them: declared-unsupported and skipped ones did not run
    return [f"Deployments: {run} run" + (": " if counted else "") + ", ".join(f"{n} {verdict}" for verdict, n in
                                                                             counted.items())
            + "".join(f"; {n} {verdict}" for verdict, n in held.items()), ""]


def baseline(report: dict) -> list[str]:
    found = report.get("baseline")
    if not found:
        return []
    origins = found.get("from") or []
    origins = ", ".join(f"`{cell(source)}`" for source in ([origins] if isinstance(origins, str) else origins))
    lines = [f"Against the baseline {origins}: {len(found.get('new') or [])} new, "
             f"{len(found.get('known') or [])} known, {len(found.get('now_passing') or [])} now passing", ""]
    new = [[cell_id] for cell_id in found.get("new") or []]
    return [*lines, *(rows(["new failing cell"], new, len(new)) + [""] if new else [])]


def render(report: dict) -> str:
    lines = [*what_ran(report), *operations(report), *defects(report), *cells(report), *unguarded_limits(report),
             *deployments(report), *baseline(report)]
    return "\n".join(lines).rstrip() + "\n"


def write(report_dir: pathlib.Path) -> pathlib.Path:
    """Write ``report_dir/summary.md`` from ``report_dir/report.json``; return its path."""
    report_dir = pathlib.Path(report_dir)
    report = sources.load(report_dir)
    if report is None:
        raise FileNotFoundError(f"{report_dir} holds no {sources.REPORT_FILE}")
    path = report_dir / SUMMARY_FILE
    recording.write_atomic(path, render(report))
    return path
