"""The report of an ``mla-fuse fuzz`` campaign: each property's verdict in a table, what failed with
the commands that replay it, what did not replay, why the campaign could not run; ``summary.json``
and the exit status (``EXIT_*``, described in ``commands/fuzz/cli.py``).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shlex

from mla_fuse_conformance.commands.fuzz.records import PropertySummary
from mla_fuse_conformance.commands.fuzz.workers import Worker, fuzz_target_count
from mla_fuse_conformance.settings import database
from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.running import recording

EXIT_PASSED, EXIT_FAILED, EXIT_BAD_ARGUMENTS, EXIT_COULD_NOT_RUN, EXIT_DID_NOT_REPLAY = 0, 1, 2, 3, 4


def format_table(summaries: dict[str, PropertySummary]) -> str:
    header = ("property", "inputs", "behaviours", "fingerprints", "first failure at input", "verdict")
    rows = [header] + [(s.nodeid, str(s.inputs), str(s.behaviors), str(s.fingerprints),
                        ", ".join(map(str, s.first_failure_at)) or "-", s.verdict)
                       for s in sorted(summaries.values(), key=lambda s: s.nodeid)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def pytest_replay_command(nodeid: str, options) -> str:
    """A developer's run of one property that replays what the database holds for it (and nothing else),
    from any directory: this interpreter, the adapter's directory on ``PYTHONPATH``, a database directory
    by its absolute path (a Redis password is shown as ``***``)."""
    test = nodeid.partition("::")[2].partition("[")[0]
    directory = not database.is_redis_url(options.db)
    db = str(pathlib.Path(options.db).absolute()) if options.db and directory else database.shown(options.db)
    python = recording.python_with(recording.import_path(options.spec))
    return (f"{recording.assignments({database.DATABASE_ENV_VAR: db})}{python} -m pytest --pyargs mla_fuse_conformance "
            f"--mla-fuse-impl={shlex.quote(options.spec)} -k {shlex.quote(test)} "
            f"--hypothesis-profile={profiles.full_name('replay')}")


def describe_failures(summaries: dict[str, PropertySummary], options) -> list[str]:
    lines = []
    for summary in sorted(summaries.values(), key=lambda s: s.nodeid):
        if summary.verdict == "FAIL":
            lines.append(f"\nFAILED {summary.nodeid} (replay pass: {summary.replay})")
            lines += [f"  {message}" for message in summary.failures]
            if not summary.replay_files:
                lines.append("  (the replay pass wrote no replay file: see its log)")
            lines += [f"  replay exactly: {recording.replay_command(pathlib.Path(path))}" for path in summary.replay_files]
            lines.append(f"  or with pytest: {pytest_replay_command(summary.nodeid, options)}")
        elif summary.verdict == "did not replay":
            first = ", ".join(map(str, summary.first_failure_at)) or "-"
            lines.append(f"\nDID NOT REPLAY {summary.nodeid}: not a failure this campaign can show")
            lines.append(f"  in the campaign: failed (first failure at input {first}): "
                         f"{'; '.join(summary.failures) or 'nothing stored for it in the database'}")
            lines.append(f"  on replay: {summary.replay or 'nothing to replay'} (the stored example, replayed by pytest "
                         f"outside HypoFuzz; a failure that depends on what ran before it in the worker)")
            lines.append(f"  try it: {pytest_replay_command(summary.nodeid, options)}")
    return lines


def campaign_errors(workers: list[Worker], summaries: dict[str, PropertySummary]) -> list[str]:
    """Why the campaign could not run as asked: a worker that died or ended on its own, no input."""
    errors = []
    for w in workers:
        if w.died():
            errors.append(f"worker {w.index} did not fuzz until the end: it died (exit status {w.process.returncode}); "
                          f"log {w.log}, which ends:\n{w.log_tail()}")
    if not any(summary.inputs for summary in summaries.values()):
        errors.append("no property ran an input: see the worker logs")
    return errors


def exit_status(summaries: dict[str, PropertySummary], errors: list[str]) -> int:
    verdicts = {summary.verdict for summary in summaries.values()}
    if "FAIL" in verdicts:
        return EXIT_FAILED
    if errors:
        return EXIT_COULD_NOT_RUN
    return EXIT_DID_NOT_REPLAY if "did not replay" in verdicts else EXIT_PASSED


VERDICT_LINES = {EXIT_PASSED: "PASS", EXIT_FAILED: "FAIL", EXIT_COULD_NOT_RUN: "COULD NOT RUN",
                 EXIT_DID_NOT_REPLAY: "DID NOT REPLAY"}


def write_report(options, workers, summaries, errors, seconds: float, out_dir: pathlib.Path) -> int:
    """Print the report, write ``summary.json``; return the exit status."""
    status = exit_status(summaries, errors)
    passed = status == EXIT_PASSED
    collected = max((fuzz_target_count(worker) or 0 for worker in workers), default=0)
    report = {
        "implementation": options.spec, "database": database.shown(options.db), "read_only": options.read_only,
        "minutes": options.minutes, "seconds": round(seconds, 1), "passed": passed, "errors": errors,
        "collected": collected, "exit_status": status, "verdict": VERDICT_LINES[status],
        "workers": [{"device": w.device, "log": str(w.log), "exit_status": w.process.returncode,
                     "stopped_by_mla_fuse": w.stopped, "died": w.died()} for w in workers],
        "properties": {nodeid: {**dataclasses.asdict(s), "verdict": s.verdict} for nodeid, s in summaries.items()},
    }
    (out_dir / "summary.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"\nmla_fuse fuzz: {options.spec}, {len(workers)} worker(s), database {database.shown(options.db)}"
          f"{' (read-only)' if options.read_only else ''}, {seconds / 60:.1f} min: HypoFuzz started "
          f"{len(summaries)} of the {collected} properties it collected (it picks by rate of new "
          f"behaviour)\n{format_table(summaries)}")
    print("\n".join(describe_failures(summaries, options) + [f"\nerror: {error}" for error in errors]))
    print(f"\nsummary: {out_dir / 'summary.json'}\nverdict: {VERDICT_LINES[status]} (exit status {status})")
    return status
