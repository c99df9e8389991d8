"""What ``verify`` prints: first what runs (the implementation, its declarations, the environment), then
the per-operation table, what was not run or not judged, the failures, the conformance map, the
declared limits and the coverage, and last the defects, the baseline and where the report is."""

from __future__ import annotations

import collections
import importlib
import pathlib
import textwrap

from mla_fuse_conformance.cases.features import describe
from mla_fuse_conformance.commands.conformance_map import baseline
from mla_fuse_conformance.commands.report import defects, document, environment
from mla_fuse_conformance.commands.verify import maps
from mla_fuse_conformance.commands.verify.summary import OperationSummary
from mla_fuse_conformance.declarations.operations import OPERATIONS, ROTATING_OPERATIONS
from mla_fuse_conformance.declarations.property_modules import PASSES_IMPLEMENTATION
from mla_fuse_conformance.running import recording
from mla_fuse_conformance.settings import profiles

TABLE_KEY = (
    "key: rope bound used = max |impl - exact| / CONTRACT §5 bound over the rotated values (exact: the float64 "
    "reference), passes <= 1, 0.5 = correctly rounded; rope ulps = max |impl - exact| / spacing of the output dtype "
    "at |exact|, not a criterion (large where a rotation cancels: the bound's 2^-22 (|a*c| + |b*s|) term allows it); "
    "fp8 codes = max distance between fp8 codes as ordered integers, passes <= 1; padded / saturated = examples with "
    "a padded slot / a saturated fp8 code; examples = cases run; passed / failed / skipped = tests.")

MAP_KEY = (
    "key: fails <cell>: the conditions (fields of the case, relations between them) the failure needs, and how it "
    "failed; fails k/n: the share of random cases inside the cell that fail; partial (k < n): a failing and a passing "
    "example one field apart; replay: the command that reruns the failing example; passes <axis>: <value>: <count>: "
    "passing examples with that feature value.")
LIMITS_KEY = (
    "key: refused: cases just outside the declared limit raised before writing anything (every byte unchanged); "
    "unguarded: such a case ran and gave a wrong result, wrote then raised (stray write), crashed or hung: a finding "
    "that fails the verdict, with its replay, unless the adapter says which caller guards it (guarded by its caller: "
    "listed, not failing); handled: such cases pass (the limit could be widened), counted only "
    "from cases that wrote an entry or rotated a row; not reached: no case with that value could be drawn, or none "
    "of those drawn did that work.")


def describe_implementation(impl) -> list[str]:
    """The declarations, the operations found, and the declared limits, as report lines."""
    provided, missing = impl.operations, [op for op in OPERATIONS if not impl.provides(op)]
    lines = [f"implementation: {impl.title}: rounding {impl.rounding}, padded rows {impl.padded_rows}, "
             f"checks inputs {'yes' if impl.checks_inputs else 'no'}",
             f"operations found: {', '.join(provided)}"]
    if missing:
        required = [op for op in missing if op in impl.required]
        lines.append(f"not provided: {', '.join(missing)}" + (f" (REQUIRED: {', '.join(required)} fail)" if required
                                                               else " (their properties are not run)"))
    for attr, op in impl.near_misses.items():
        lines.append(f"warning: {attr!r} is not an operation of the contract; did you mean {op!r}?"
                     + ("" if op in impl.required else " (--require it to make its absence a failure)"))
    for op in provided:
        rotates = op in ROTATING_OPERATIONS
        limits = impl.caps(op).describe(rotates)
        lines.append(f"declared limits of {op}: " + ("; ".join(limits) if limits else "none (the whole contract)"))
    return lines


def print_what_ran(impl, profile: str, found: dict, version: str | None, header: list[str]) -> None:
    """The report's first lines: the implementation and its version, the profile, the device and
    backend, the versions, the CPU's vector flags, then the declarations (``header``)."""
    lines = [f"{impl.title} version {version or 'unknown'}, {profile} profile",
             *environment.describe_environment(found), *header]
    print("\n".join(f"mla-fuse verify: {line}" for line in lines), flush=True)


def format_table(summaries: dict[str, OperationSummary]) -> str:
    header = ("operation", "examples", "rope bound used", "rope ulps", "fp8 codes", "padded", "saturated",
              "passed", "failed", "skipped", "verdict")
    rows = [header]
    for op in (op for op in OPERATIONS if op in summaries):
        s = summaries[op]
        rows.append((op, str(s.examples), f"{s.worst_rope_bound_fraction:.3g}", f"{s.worst_rope_ulps:.3g}",
                     str(s.worst_fp8_code_diff), str(s.padded_slot_cases), str(s.saturation_cases), str(s.passed),
                     str(s.failed), str(s.skipped), s.verdict))
    others = [("other checks (no one operation's examples)", "passed", "failed", "skipped", "verdict")]
    others += [(name, str(s.passed), str(s.failed), str(s.skipped), s.verdict)
               for name, s in sorted(summaries.items()) if name not in OPERATIONS]
    return "\n".join([*aligned(rows), wrapped(TABLE_KEY), *(["", *aligned(others)] if len(others) > 1 else [])])


def aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` (the first the header) as columns padded to their widest cell, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def wrapped(key: str) -> str:
    return "\n".join(textwrap.wrap(key, 110, subsequent_indent="     "))


def not_run(impl, profile: str) -> list[str]:
    """What the suite leaves out for ``impl`` in ``profile`` (the plugin deselects the properties
    that would only skip; ``test_large_addresses`` skips in the profiles ``settings/profiles.py`` names)."""
    missing = [op for op in OPERATIONS if not impl.provides(op) and op not in impl.required]
    lines = [f"the properties of {', '.join(missing)} (not provided)"] if missing else []
    if not impl.checks_inputs:
        lines.append("bad-input properties: the implementation declares checks_inputs=False")
    if impl.spec != PASSES_IMPLEMENTATION:  # verify ignores their module (run.py's ignored_modules)
        lines.append("compile passes: they call mla_fuse's own ops, so they check the triton implementation only")
    if profile in profiles.LARGE_ADDRESSES_SKIPPED_IN:
        lines.append(f"large addresses: {profiles.LARGE_ADDRESSES_NOT_RUN}")
    return lines


def print_report(impl, profile: str, elapsed: float, summaries: dict[str, OperationSummary], outcomes: list[dict],
                 report: dict, phase: maps.MapPhase) -> None:
    """The verdict: the table, what was not run or not judged, the failures, the map, the limits, the coverage."""
    print(f"\nmla-fuse verify: {impl.spec} ({profile} profile, {elapsed:.0f} s)\n{format_table(summaries)}")
    print("".join(f"not run: {line}\n" for line in not_run(impl, profile)), end="")
    print("".join(f"not judged: {op}: {s.not_judged} examples too slow under Triton's interpreter (estimated up to "
                  f"{s.not_judged_estimate:.0f} s each; $MLA_FUSE_INTERPRETER_BUDGET): neither passed nor failed\n"
                  for op, s in summaries.items() if s.not_judged), end="")
    print_failures(outcomes, impl.spec, profiles.full_name(profile))
    print_maps(phase.maps)
    print_limits(phase.limits)
    print("\n".join(["", *maps.lines(report["run"]["map"])]))
    print("\n" + "\n".join(document.coverage_lines(report["coverage"])))


def print_failures(outcomes: list[dict], spec: str, profile: str) -> None:
    failures = [line["failure"] for line in outcomes if line.get("failure")]
    others = [line for line in outcomes if line["outcome"] == "failed" and not line.get("failure")]
    if failures or others:
        print("\nfailures:")
        for failure in failures:
            print(f"  {failure['property']}: {failure['kind']} on {describe(failure.get('features', {}))}\n"
                  + (f"      shrinking {failure['shrinking']}\n" if failure.get("shrinking") else "")
                  + f"      replay: {recording.replay_command(pathlib.Path(failure['file']))}")
        for line in others:
            message = (line.get("message") or "").splitlines()
            errors = ([text[1:].strip() for text in message if text.startswith("E ")]  # an assertion, an exception
                      or [text.strip() for text in message if " crashed while running " in text])  # xdist: a worker died
            statement = check_statement(line["nodeid"])
            print(f"  {line['nodeid']}: failed" + (f": {errors[0][:300]}" if errors else "")
                  + (f"\n      checks: {statement}" if statement else "")
                  + f"\n      rerun: {check_command(line['nodeid'], spec, profile)}")


def check_command(nodeid: str, spec: str, profile: str) -> str:
    """``pytest_command`` for a failing check that is not one property's examples (``nodeid``:
    ``properties/test_large_addresses.py::test_query_rows_a_huge_stride_apart``), run from anywhere."""
    path, _, item = nodeid.partition("::")
    check = {"property": f"{pathlib.PurePosixPath(path).stem}:{item.partition('[')[0]}", "impl": spec,
             "pythonpath": recording.import_path(spec)}
    return recording.pytest_command(check, nodeid, profile)


def check_statement(nodeid: str) -> str | None:
    """The first paragraph of the docstring of the check ``nodeid`` names (what it varies: its trigger),
    on one line; None where it has none or its module does not import."""
    path, _, item = nodeid.partition("::")
    try:
        module = importlib.import_module(f"mla_fuse_conformance.properties.{pathlib.PurePosixPath(path).stem}")
    except ImportError:
        return None
    doc = (getattr(getattr(module, item.partition("[")[0], None), "__doc__", None) or "").strip()
    return " ".join(doc.split("\n\n")[0].split()) if doc else None


def print_maps(found: list) -> None:
    if found:
        print("\nconformance map (failing cells, each with a replay file; then the feature values of passing examples):")
        for property_map in found:
            print("\n".join(property_map.lines()))
        print(wrapped(MAP_KEY))


def print_limits(limits: list) -> None:
    if limits:
        print("\ndeclared limits, each checked with a few cases just outside it:")
        by_outcome = collections.Counter(check.outcome.partition(":")[0] for check in limits)
        for check in limits:
            note = {"handled": "declared unsupported, but handled"}.get(check.outcome, check.outcome)
            print(f"  {check.operation}: {check.axis} {check.value}: {note} ({check.detail})"
                  + (f"\n      guarded by its caller: {check.guarded_by}" if check.guarded_by else "")
                  + (f"\n      replay: {recording.replay_command(pathlib.Path(check.file))}" if check.file else ""))
        print(f"  ({by_outcome['unguarded']} unguarded, {by_outcome['refused']} refused, {by_outcome['handled']} "
              "handled though declared unsupported)")
        print(wrapped(LIMITS_KEY))


def print_closing(report: dict, report_dir: pathlib.Path, written: list[pathlib.Path]) -> None:
    """The last lines: the defects, the baseline's account, where the report is, and the verdict."""
    print("\n".join(["", *defects.console_lines(report), *baseline.lines(report),
                     f"report: {report_dir / 'report.json'}, {', '.join(map(str, written))}, "
                     f"JUnit: {report_dir / 'junit.xml'}", baseline.verdict_line(report)]))
