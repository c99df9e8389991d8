"""``verify --baseline OLD/report.json`` and ``--known-failures FILE``: gate on new failures only.

A run's failing ids (report.json's ``failing``) are the ids of its conformance map's failing cells
(``cells[].id``: ``property | kind class | condition text``) and one id per failing test that no
cell of the same kind covers (``property | failed test (KIND) | file.py::test[params]``): a
bad-input property, a property whose map could not be finished or was not run (``--map-rounds 0``),
a failure whose features lie in no cell the map found. So a baseline made from a run holds every
way that run failed, and anything else the next run fails by is new.

The verdict under a baseline: exit 0 when every failing id is known (listed by the baseline
report's ``failing``, or its cells for a report that predates it, or by a known-failures file),
1 when some are new (each printed), 2 when the run could not run. Known ids whose property ran and
that failed no more are listed as now passing. Ids match exactly but for one thing that varies
between runs of one kernel: ``wrong result`` and ``crashed (SIGNAL)`` are one kind (``match_key``).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from mla_fuse_conformance.commands.conformance_map.identity import cell_id, kind_class, kind_family

BASELINE_OPTION, KNOWN_FAILURES_OPTION, WRITE_OPTION = "--baseline", "--known-failures", "--write-known-failures"
FAILED_TEST = "failed test"
KNOWN_FAILURES_HEADER = (
    "# mla-fuse known failures: one failing id per line (report.json's `failing`); '#' starts a comment line.\n"
    "# verify --known-failures THIS_FILE exits 0 while the run fails by these ids only.\n")


class BaselineError(ValueError):
    """A baseline or known-failures file that cannot be read: one line naming the option."""


@dataclasses.dataclass(frozen=True)
class Known:
    """The failing ids a run may fail by, and where they came from."""

    ids: frozenset[str]
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()
    cells: tuple[dict, ...] = ()  # the baseline reports' cells (schema 2): the map sorts their failures out first


def property_key(nodeid: str) -> str:
    """``test_mla:test_mla_cache_write_matches_reference`` for any test id (the properties' naming)."""
    path, _, function = nodeid.partition("::")
    return f"{pathlib.PurePath(path).stem}:{function.partition('[')[0]}"


def short_nodeid(nodeid: str) -> str:
    """The test id without its directory (which differs between installs and checkouts)."""
    path, _, rest = nodeid.partition("::")
    return f"{pathlib.PurePath(path).name}::{rest}"


def match_key(failing_id: str) -> str:
    """What two ids must share to match: the id with ``wrong result`` and ``crashed (SIGNAL)`` one
    kind. A failure that corrupts memory shows either way from run to run in the same cell
    (vLLM's CPU cache write past a block: SIGSEGV in one run, a wrong result in the next);
    ``raised TYPE`` and ``hung`` match only themselves."""
    prop, _, rest = failing_id.partition(" | ")
    kind, _, condition = rest.partition(" | ")
    test = kind.startswith(f"{FAILED_TEST} (")
    inner = kind[len(FAILED_TEST) + 2:-1] if test else kind
    if inner == "wrong result" or inner.startswith("crashed"):
        inner = "wrong result or crashed"
    return f"{prop} | {f'{FAILED_TEST} ({inner})' if test else inner} | {condition}"


def failed_test_id(line: dict) -> str:
    """``property | failed test (KIND) | file.py::test[params]``: KIND the failure's class, else the phase that
    failed (``call``, ``setup``), ``crashed`` for a worker that died (pytest-xdist reports its phase as ``???``)."""
    failure = line.get("failure") or {}
    when = line.get("when", "call")
    kind = kind_class(failure["kind"]) if failure.get("kind") else "crashed" if when == "???" else when
    return f"{failure.get('property') or property_key(line['nodeid'])} | {FAILED_TEST} ({kind}) | " \
           f"{short_nodeid(line['nodeid'])}"


def covered(failure: dict, cells: list[dict]) -> bool:
    """Whether a cell of ``failure``'s property and kind has feature values the failure has (not one
    whose diagnosis the map's time budget cut short: ``cut_short``)."""
    features = failure.get("features") or {}
    return any(cell["property"] == failure.get("property") and not cell.get("cut_short")
               and kind_family(cell["kind"]) == kind_family(failure["kind"])
               and all(features.get(axis) == value for axis, value in (cell["condition"]["features"] or {}).items())
               for cell in cells)


def failing_ids(cells: list[dict], outcomes: list[dict], unmapped: tuple[dict, ...] | list[dict] = ()) -> list[str]:
    """Every way a run failed: its cells' ids, then the failing tests no cell covers. ``unmapped``: a
    baseline's cells of the properties this run did not map (``--map-seconds``, a signal): a failure
    inside one of them counts as that cell's id. A cell whose diagnosis was cut short (``cut_short``) has
    no id here: its failing tests count by their own, so no verdict hangs on how far a diagnosis got."""
    found = list(dict.fromkeys(cell["id"] for cell in cells if not cell.get("cut_short")))
    for line in outcomes:
        if line["outcome"] != "failed":
            continue
        failure = line.get("failure") or {}
        if failure.get("kind") and covered(failure, cells):
            continue
        inside = [cell["id"] for cell in unmapped if failure.get("kind") and covered(failure, [cell])]
        found.append(inside[0] if inside else failed_test_id(line))
    return list(dict.fromkeys(found))


def limit_id(check: dict) -> str:
    """``limit | concat_and_cache_mla: kv_cache_dtype fp8 | unguarded: wrong result``: an unguarded declared limit."""
    return f"limit | {check['operation']}: {check['axis']} {check['value']} | {check['outcome']}"


def read_report(path: pathlib.Path) -> dict:
    """An earlier report.json (schema 2 or 1), or a ``BaselineError`` naming the option."""
    shown = f"{BASELINE_OPTION} {path}"
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(f"{shown}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise BaselineError(f"{shown}: cannot be read: {error}") from None
    except ValueError as error:
        raise BaselineError(f"{shown}: not JSON ({error})") from None
    if not isinstance(report, dict) or report.get("schema", 1) not in (1, 2) or "implementation" not in report:
        what = f"schema {report['schema']}" if isinstance(report, dict) and "schema" in report else "another JSON file"
        raise BaselineError(f"{shown}: not a report.json of mla-fuse verify (schema 2 or 1), found {what}")
    return report


def report_ids(path: pathlib.Path, report: dict | None = None) -> tuple[set[str], str | None]:
    """The failing ids of an earlier report.json, and a note where they are only its cells."""
    report = report if report is not None else read_report(path)
    if "failing" in report:
        return set(report["failing"]), None
    note = (f"{BASELINE_OPTION} {path} predates report.json's `failing`: only its map's cells are known; its other "
            "failing tests count as new")
    if report.get("schema") == 2:
        return {cell["id"] for cell in report.get("cells", [])}, note
    # schema 1 only: property_map loads torch, which reading a schema-2 baseline does not need
    from mla_fuse_conformance.commands.conformance_map.property_map import Cell

    return {cell_id(found["property"], cell["kind"], Cell(**cell).title())
            for found in report.get("maps", []) for cell in found["cells"]}, note


def known_failures_ids(path: pathlib.Path) -> set[str]:
    """A known-failures file: one failing id per line; blank lines and lines starting with ``#`` skipped."""
    shown = f"{KNOWN_FAILURES_OPTION} {path}"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BaselineError(f"{shown}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise BaselineError(f"{shown}: cannot be read: {error}") from None
    ids = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if len(line.split(" | ")) < 3:
            raise BaselineError(f"{shown}: line {number} is not a failing id `property | kind | condition`: {line!r}")
        ids.add(line)
    return ids


def load(baselines: list[pathlib.Path], known_files: list[pathlib.Path]) -> Known | None:
    """The known ids of every ``--baseline`` and ``--known-failures`` given (None: neither given)."""
    if not baselines and not known_files:
        return None
    ids, notes, cells = set(), [], []
    for path in baselines:
        report = read_report(path)
        found, note = report_ids(path, report)
        ids |= found
        notes += [note] if note else []
        cells += [cell for cell in report.get("cells", []) if report.get("schema") == 2 and cell["id"] in found]
    for path in known_files:
        ids |= known_failures_ids(path)
    return Known(frozenset(ids), tuple(str(path.absolute()) for path in [*baselines, *known_files]), tuple(notes),
                 tuple(cells))


def judge(report: dict, outcomes: list[dict], known: Known | None) -> int:
    """Add ``failing``, ``baseline`` and each cell's ``known`` to ``report``, set ``run.exit_code``
    (0 when no failing id is new and the run could run) and return it. The known ids of a property
    the run did not map (``run.map.not_mapped``) that it failed by no more are ``not_run``, not
    ``now_passing``: no map looked for them."""
    not_mapped = set((report["run"].get("map") or {}).get("not_mapped") or ())
    failing = failing_ids(report["cells"], outcomes,
                          [cell for cell in (known.cells if known else ()) if cell.get("property") in not_mapped])
    failing += [limit_id(check) for check in report.get("limits") or ()
                if check["outcome"].startswith("unguarded") and not check.get("guarded_by")]
    report["failing"] = failing
    exit_code = report["run"]["exit_code"]
    if known is None:
        report["baseline"] = None
        return exit_code
    ran = {property_key(line["nodeid"]) for line in outcomes if line["outcome"] != "skipped"} - not_mapped
    known_keys, failing_keys = {match_key(i) for i in known.ids}, {match_key(i) for i in failing}
    gone = sorted(i for i in known.ids if match_key(i) not in failing_keys)
    report["baseline"] = {"from": list(known.sources), "known": [i for i in failing if match_key(i) in known_keys],
                          "new": [i for i in failing if match_key(i) not in known_keys],
                          "now_passing": [i for i in gone if i.split(" | ")[0] in ran],
                          "not_run": [i for i in gone if i.split(" | ")[0] not in ran]}
    for cell in report["cells"]:
        cell["known"] = match_key(cell["id"]) in known_keys
    pytest_ran = report["run"]["pytest_exit_code"] in (0, 1, 5) and outcomes
    if exit_code == 1 and pytest_ran and not report["baseline"]["new"] and (failing or report["verdict"] == "PASS"):
        exit_code = 0
    report["run"]["exit_code"] = exit_code
    return exit_code


def lines(report: dict) -> list[str]:
    """What the baseline decided, printed before the verdict."""
    found = report.get("baseline")
    if not found:
        return []
    return [*(f"new failing cell: {i}" for i in found["new"]),
            *(f"known, now passing: {i}" for i in found["now_passing"]),
            f"baseline: {len(found['known'])} known failing, {len(found['new'])} new, "
            f"{len(found['now_passing'])} known now passing, {len(found['not_run'])} known not run "
            f"(from {', '.join(found['from'])})"]


def verdict_line(report: dict) -> str:
    """``verdict: FAIL (known failures only: 5 known, 0 new) -> exit 0``."""
    verdict, exit_code, found = report["verdict"], report["run"]["exit_code"], report.get("baseline")
    if not found:
        return f"verdict: {verdict}"
    if verdict == "PASS":
        return f"verdict: PASS ({len(found['now_passing'])} known now passing) -> exit {exit_code}"
    if found["new"]:
        return f"verdict: FAIL ({len(found['new'])} new, {len(found['known'])} known) -> exit {exit_code}"
    if exit_code:
        return f"verdict: FAIL (no new failing id, but pytest exited {report['run']['pytest_exit_code']}) -> exit 1"
    return f"verdict: FAIL (known failures only: {len(found['known'])} known, 0 new) -> exit 0"


def write_known_failures(path: pathlib.Path, report: dict) -> None:
    """The run's failing ids as a known-failures file (how a team starts one)."""
    path.write_text(KNOWN_FAILURES_HEADER + f"# from {report['implementation'].get('spec')}, "
                    f"{report['run']['started']}\n" + "".join(f"{i}\n" for i in report["failing"]))
