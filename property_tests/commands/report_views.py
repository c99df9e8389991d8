"""The views of a report directory, written from its ``report.json``: ``report.html``
(``report_html.py``) and ``summary.md`` (``report_markdown.py``). ``verify`` writes them right after
report.json; ``mla-fuse report DIR`` writes them again for an existing directory (a CI artifact,
a committed report, schema 1 included)."""

from __future__ import annotations

import pathlib
import sys

from mla_fuse_conformance.commands import report_html, report_markdown, report_sources


def write(report_dir: pathlib.Path, step_summary: str | None = None) -> list[pathlib.Path]:
    """Write the views (a directory with only ``comparison.json`` gets the page alone); append the
    summary to the file ``step_summary`` names (GitHub's ``$GITHUB_STEP_SUMMARY``) where one is
    given. Returns the paths written."""
    written = [report_html.write(report_dir)]
    if (pathlib.Path(report_dir) / report_sources.REPORT_FILE).is_file():
        written.append(report_markdown.write(report_dir))
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as job_summary:
                job_summary.write(written[-1].read_text() + "\n")
    return written


def main(report_dir: pathlib.Path) -> int:
    """``mla-fuse report DIR``: exit 0 written, 2 no report there or one that cannot be read."""
    try:
        written = write(report_dir)
    except FileNotFoundError as error:
        print(f"mla-fuse report: DIR: {error} (written by mla-fuse verify or compare --report-dir DIR)", file=sys.stderr)
        return 2
    except ValueError as error:  # json.JSONDecodeError included
        print(f"mla-fuse report: DIR: {report_dir} holds a report that cannot be read: {error}", file=sys.stderr)
        return 2
    print(f"report: {', '.join(map(str, written))}")
    return 0
