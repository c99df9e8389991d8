"""The views of a report directory, written from its ``report.json``: ``report.html``
(``html.py``) and ``summary.md`` (``markdown.py``). ``verify`` writes them right after
report.json; ``mla-fuse report DIR`` writes them again for an existing directory (a CI artifact,
a committed report, schema 1 included)."""

from __future__ import annotations

import pathlib
import sys

from mla_fuse_conformance.commands.report import document
from mla_fuse_conformance.commands.report import html
from mla_fuse_conformance.commands.report import markdown
from mla_fuse_conformance.commands.report import sources
from mla_fuse_conformance.commands.repro import script


def write(report_dir: pathlib.Path, step_summary: str | None = None) -> list[pathlib.Path]:
    """Write the views (a directory with only ``comparison.json`` gets the page alone); append the
    summary to the file ``step_summary`` names (GitHub's ``$GITHUB_STEP_SUMMARY``) where one is
    given. Returns the paths written."""
    written = [html.write(report_dir)]
    if (pathlib.Path(report_dir) / sources.REPORT_FILE).is_file():
        written.append(markdown.write(report_dir))
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as job_summary:
                job_summary.write(written[-1].read_text() + "\n")
    return written


def relocate_failure_files(report_dir: pathlib.Path, report: dict) -> int:
    """A report directory that was moved or committed (docs/vllm-cpu): a cell's or failure's
    ``replay.file`` that no longer exists is looked up under ``REPORT_DIR/failures/`` by its name
    (where ``MLA_FUSE_FAILURE_DIR`` put it) and rewritten. Returns how many were moved."""
    moved = 0
    for entry in [*report.get("cells", []), *report.get("failures", [])]:
        replay = entry.get("replay") or {}
        old = replay.get("file")
        if old and not pathlib.Path(old).exists():
            beside = pathlib.Path(report_dir).absolute() / "failures" / pathlib.PurePath(old).name
            if beside.exists():
                replay["file"], moved = str(beside), moved + 1
    return moved


def reproduce(report_dir: pathlib.Path) -> None:
    """``mla-fuse report --reproducers DIR``: write and run a reproducer per failing cell of a
    schema-2 report that has none yet (as ``verify`` does), then the views."""

    report = sources.read_json(pathlib.Path(report_dir) / sources.REPORT_FILE)
    if report is None or report.get("schema", 1) < 2:
        raise ValueError("--reproducers needs a schema-2 report.json (written by mla-fuse verify)")
    relocate_failure_files(report_dir, report)
    document.write(report_dir, script.write_reproducers(pathlib.Path(report_dir), report))


def main(report_dir: pathlib.Path, reproducers: bool = False) -> int:
    """``mla-fuse report DIR``: exit 0 written, 2 no report there or one that cannot be read."""
    try:
        if reproducers:
            reproduce(report_dir)
        written = write(report_dir)
    except FileNotFoundError as error:
        print(f"mla-fuse report: DIR: {error} (written by mla-fuse verify or compare --report-dir DIR)", file=sys.stderr)
        return 2
    except ValueError as error:  # json.JSONDecodeError included
        print(f"mla-fuse report: DIR: {report_dir} holds a report that cannot be read: {error}", file=sys.stderr)
        return 2
    print(f"report: {', '.join(map(str, written))}")
    return 0
