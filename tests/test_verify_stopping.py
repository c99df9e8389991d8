"""A ``verify`` stopped during its map leaves its verdict (commands/verify/stopping.py, verify/maps.py).

report.json, report.html and summary.md are written as soon as the properties end and rewritten as
each map finishes; a SIGTERM during the map leaves the last complete report, marked as stopped after
N of M properties, and the exit status the properties gave. A SIGTERM before the properties end
exits 2. ``--map-seconds`` bounds the whole map phase: the properties with the most failing tests
are mapped first, the others listed as not mapped.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from mla_fuse_conformance.commands.report import markdown
from mla_fuse_conformance.commands.verify import maps

ROPE = "test_rotary_embedding:test_rotary_embedding_matches_reference"
CACHE = "test_mla:test_mla_cache_write_matches_reference"
FUSED = "test_mla:test_fused_mla_matches_reference"
DEPLOYED = "test_deployments:test_rotary_embedding_in_deployment"
PLANTED = '''
import os
import time

from mla_fuse_conformance.mutants.kernels import MUTANTS

SLOW = "slow"  # a file in the working directory naming an operation: each call of it takes a minute


def slow(operation):
    if os.path.exists(SLOW) and open(SLOW).read() == operation:
        time.sleep(60)


class RopeAndCacheBugs(MUTANTS["sin_sign_flipped"]):
    """The rope bug of mutant:sin_sign_flipped and the cache-write bug of mla_regions_swapped."""

    name = "rope-and-cache-bugs"

    def rotary_embedding(self, *args, **kwargs):
        slow("rotary_embedding")
        return super().rotary_embedding(*args, **kwargs)

    def concat_and_cache_mla(self, *args, **kwargs):
        slow("concat_and_cache_mla")
        return MUTANTS["mla_regions_swapped"]().concat_and_cache_mla(*args, **kwargs)
'''


def start_verify(directory: pathlib.Path, *options: str) -> subprocess.Popen:
    (directory / "planted.py").write_text(PLANTED)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    env.pop("GITHUB_STEP_SUMMARY", None)
    env["PYTHONPATH"] = os.pathsep.join([str(directory), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.Popen(
        [sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", "planted:RopeAndCacheBugs", "--profile",
         "dev", "-n", "0", "--report-dir", str(directory / "reports"), *options, "--", "-k",
         "test_rotary_embedding_matches_reference or test_mla_cache_write_matches_reference", "--hypothesis-seed=0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=directory, env=env)


def signal_at(child: subprocess.Popen, wanted, timeout: float = 600) -> tuple[int, str]:
    """SIGTERM to ``child`` as soon as it prints a line for which ``wanted(line, lines so far)`` holds;
    its exit status and everything it printed."""
    printed = []
    for line in child.stdout:
        printed.append(line)
        if wanted(line, printed):
            child.send_signal(signal.SIGTERM)
            break
    rest, _ = child.communicate(timeout=timeout)
    return child.returncode, "".join(printed) + rest


def test_a_sigterm_during_the_map_leaves_the_report_of_what_was_mapped_and_the_properties_verdict(tmp_path):
    """report.json is read when each of two maps starts (written before the map, rewritten after each
    map: what a SIGKILL would leave), then SIGTERM when the second starts, its operation made to take a
    minute a call (so that map is surely running, a case in the executor): the first map is in the
    report, the second listed as not mapped, exit 1 (the properties failed). Planted: without the
    early write (verify/run.py's ``publish`` before the map) the first read finds no report."""
    reports, seen = tmp_path / "reports", []

    def at_the_second_map(line: str, lines: list[str]) -> bool:
        if line.startswith("mla-fuse verify: mapping ") and line.rstrip().endswith(" ..."):
            seen.append(json.loads((reports / "report.json").read_text()))
            assert (reports / "report.html").exists() and (reports / "summary.md").exists()
            if len(seen) == 1:  # the other property's operation takes a minute a call: its map is running
                other = "concat_and_cache_mla" if ROPE in line else "rotary_embedding"
                (tmp_path / "slow").write_text(other)
        return len(seen) == 2

    code, out = signal_at(start_verify(tmp_path, "--map-rounds", "1"), at_the_second_map)
    assert [(found["verdict"], found["run"]["map"]["mapped"], found["run"]["map"]["running"]) for found in seen] == [
        ("FAIL", 0, True), ("FAIL", 1, True)], out
    assert code == 1, out
    assert not running_with(str(reports)), "the map's executor (in its minute-long case) outlived verify"
    report = json.loads((reports / "report.json").read_text())
    phase = report["run"]["map"]
    assert phase["properties"] == 2 and phase["mapped"] == 1 and phase["stopped"] == "SIGTERM", phase
    assert not phase["running"] and phase["limits_checked"], phase  # the planted kernel declares no limit
    assert phase["not_mapped"] == [name for name in (CACHE, ROPE) if name != report["maps"][0]["property"]], phase
    assert report["verdict"] == "FAIL" and report["run"]["exit_code"] == 1 and len(report["maps"]) == 1
    assert {cell["property"] for cell in report["cells"]} == {report["maps"][0]["property"]}, report["cells"]
    text = f"1 of 2 failing properties mapped; the map was stopped by SIGTERM; not mapped: {phase['not_mapped'][0]}"
    assert text in (reports / "summary.md").read_text() and text in (reports / "report.html").read_text()
    assert f"conformance map: {text}" in out and "stopped by SIGTERM: no reproducers written" in out, out
    assert "verdict: FAIL" in out and not (reports / "reproducers").exists(), out
    assert not list(reports.glob(".*.partial")), list(reports.iterdir())


@pytest.mark.parametrize("at", ["$ ", "=== test session starts"])
def test_a_sigterm_before_the_properties_end_ends_pytest_and_exits_2(tmp_path, at):
    """At the pytest command (the child may not have started) and once pytest runs (it is terminated)."""
    child = start_verify(tmp_path)
    code, out = signal_at(child, lambda line, lines: at in line)
    assert code == 2, out
    assert "mla-fuse verify: stopped by SIGTERM before the properties ended: no verdict, no report.json (exit 2)" \
        in out, out
    assert not (tmp_path / "reports" / "report.json").exists()
    assert not running_with(str(tmp_path / "reports")), "the pytest child outlived verify"
    outcomes = tmp_path / "reports" / "outcomes.jsonl"
    assert len(outcomes.read_text().splitlines() if outcomes.exists() else []) < 2, "pytest ran on to its end"


def running_with(argument: str) -> list[str]:
    """The processes (Linux: /proc) with ``argument`` in their command line."""
    found = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if argument in cmdline.read_bytes().decode(errors="replace"):
                found.append(cmdline.parent.name)
        except OSError:  # ended meanwhile
            continue
    return found


@pytest.fixture
def fake_maps(monkeypatch):
    """``map_property`` that takes 100 s of a fake clock per map (or per round, asked ``out_of_time``)."""
    from mla_fuse_conformance.commands.conformance_map import property_map

    clock, mapped = [0.0], []

    def map_property(prop, impl, device, run, max_examples, rounds, known=(), on_step=None, baseline=(),
                     out_of_time=lambda: False, found=()):
        mapped.append(prop.name)
        for number in range(rounds):
            if number and out_of_time():
                return property_map.PropertyMap(prop.name, prop.operations, [], {}, number, False, stopped="budget")
            clock[0] += 100.0
        return property_map.PropertyMap(prop.name, prop.operations, [], {}, rounds, True)

    monkeypatch.setattr(property_map, "map_property", map_property)
    return clock, mapped


def outcomes_failing(**failing: int) -> list[dict]:
    """Outcome lines: per property (``ROPE=1``, by the names above) so many failing tests."""
    names = {"ROPE": ROPE, "CACHE": CACHE, "FUSED": FUSED, "DEPLOYED": DEPLOYED}
    found = []
    for key, count in failing.items():
        module, _, function = names[key].partition(":")
        found += [{"nodeid": f"properties/{module}.py::{function}[{n}]", "outcome": "failed",
                   "failure": {"property": names[key]}} for n in range(count)]
    return found


def test_searching_properties_are_mapped_before_those_of_fixed_examples():
    """A deployment property fails one test per deployment: ordered by failing tests alone it was mapped
    first, from its large fixed cases (minutes), where a searching map finds the cell in seconds and
    the deployments' map then confirms it."""
    assert maps.to_map(outcomes_failing(DEPLOYED=9, ROPE=1, CACHE=3)) == [CACHE, ROPE, DEPLOYED]


def test_the_map_seconds_budget_maps_the_most_failing_first_and_lists_the_rest_as_not_mapped(fake_maps, capsys):
    from mla_fuse_conformance.contract.implementation import load_implementation

    clock, mapped = fake_maps
    outcomes = outcomes_failing(ROPE=1, CACHE=3, FUSED=2)
    phase = maps.MapPhase(maps.to_map(outcomes), rounds=1, seconds=150)
    assert phase.properties == [CACHE, FUSED, ROPE]  # the most failing tests first
    phases = {}
    maps.run_maps(load_implementation("reference"), outcomes, "dev", phase, phases, clock=lambda: clock[0])
    assert mapped == [CACHE, FUSED] and phases["map"] == 200.0, mapped  # no map starts past the budget
    found = phase.as_json()
    assert found["stopped"] == "budget" and found["not_mapped"] == [ROPE] and found["mapped"] == 2, found
    assert not found["limits_checked"] and phase.limits == []
    assert maps.lines(found) == [f"conformance map: 2 of 3 failing properties mapped; the map's time budget "
                                 f"(--map-seconds) was spent; not mapped: {ROPE}; declared limits not all checked"]
    summary = markdown.render({"run": {"map": found}, "verdict": "FAIL"})
    assert f"**Conformance map:** 2 of 3 failing properties mapped" in summary and ROPE in summary, summary


def test_a_map_running_when_the_budget_is_spent_stops_after_its_round(fake_maps):
    from mla_fuse_conformance.contract.implementation import load_implementation

    clock, mapped = fake_maps
    outcomes = outcomes_failing(ROPE=1)
    phase = maps.MapPhase(maps.to_map(outcomes), rounds=6, seconds=250)
    maps.run_maps(load_implementation("reference"), outcomes, "dev", phase, {}, clock=lambda: clock[0])
    assert clock[0] == 300.0 and phase.maps[0].stopped == "budget" and not phase.maps[0].complete
    assert "(stopped at the map's time budget (--map-seconds); more cells may fail)" in phase.maps[0].lines()[0]
    assert phase.as_json()["not_mapped"] == [] and phase.as_json()["mapped"] == 1


def test_no_map_lists_every_failing_property_as_not_mapped():
    for rounds, seconds in ((0, 600), (6, 0)):
        found = maps.MapPhase([ROPE, CACHE], rounds, seconds).as_json()
        assert found["stopped"] == "off" and found["not_mapped"] == [ROPE, CACHE] and not found["running"], found


def test_map_seconds_must_be_a_number_of_seconds(capsys):
    from mla_fuse_conformance.commands import cli

    for bad in ("-1", "soon", "nan"):
        with pytest.raises(SystemExit) as stopped:
            cli.main(["verify", "--map-seconds", bad])
        assert stopped.value.code == 2
        assert f"--map-seconds: expected a number of seconds" in capsys.readouterr().err
