"""Progress lines (commands/progress.py): in place in a terminal, throttled to one per 30 s in a log;
the pytest child's count of properties done and examples."""

from __future__ import annotations

import types

import pytest

pytest_plugins = ["pytester"]

from mla_fuse_conformance.commands import progress
from mla_fuse_conformance.running.executor import Crashed


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_in_a_log_one_line_per_30_s_and_every_phase_line():
    written, clock = [], Clock()
    shown = progress.Progress(written.append, tty=False, clock=clock)
    shown.update("a")  # the first state is shown at once
    clock.now += 29.9
    shown.update("b")
    clock.now += 0.1
    shown.update("c")
    shown.phase("phase ends")  # always, and the 30 s start again
    clock.now += 10
    assert not shown.due()
    shown.update("d")
    clock.now += 20
    assert shown.due()
    assert written == ["a\n", "c\n", "phase ends\n"]


def test_in_a_terminal_every_state_rewrites_the_line_in_place():
    written = []
    shown = progress.Progress(written.append, tty=True, clock=Clock())
    shown.update("mapping x: 10 cases")
    shown.update("mapping x: 9")
    shown.phase("done")
    assert written == ["\rmapping x: 10 cases", "\rmapping x: 9".ljust(len("\rmapping x: 10 cases")), "\ndone\n"]


def test_a_map_counts_its_cases_and_failures_and_passes_their_outcome_on():
    written, clock = [], Clock()
    shown = progress.Progress(written.append, tty=True, clock=clock)

    def run(case):
        clock.now += 61
        if case == "crash":
            raise Crashed("SIGSEGV")
        return case

    counted = progress.Counted(run, shown, "mapping test_mla:test_x", clock=clock)
    assert counted("ok") == "ok"
    with pytest.raises(Crashed):
        counted("crash")
    assert written[-1].strip() == "mla-fuse verify: mapping test_mla:test_x: 2 cases tried, 1 failing, 2:02"


class Terminal:
    def __init__(self) -> None:
        self.text = ""

    def ensure_newline(self) -> None:
        if self.text and not self.text.endswith("\n"):
            self.text += "\n"

    def write(self, text: str, flush: bool = False) -> None:
        self.text += text


def test_the_pytest_child_prints_properties_done_and_examples_every_30_s():
    terminal, clock = Terminal(), Clock()
    hooks = progress.PytestProgress(terminal, clock=clock)
    hooks.pytest_xdist_node_collection_finished(None, ["a", "b", "c"])
    terminal.write("..")  # pytest's own progress
    for when, outcome, examples in [("setup", "passed", 0), ("call", "passed", 30), ("setup", "skipped", 0)]:
        hooks.pytest_runtest_logreport(types.SimpleNamespace(
            when=when, passed=outcome == "passed", user_properties=[("mla_fuse_metrics", {"examples": examples})]))
    assert terminal.text == ".."  # not 30 s yet
    clock.now += 95
    hooks.tick()
    hooks.tick()
    assert terminal.text == "..\nmla-fuse verify: properties done 2/3, examples 30, elapsed 1:35\n"
    assert progress.properties_line(0, None, 0, 3600) == "mla-fuse verify: properties done 0/?, examples 0, elapsed 60:00"


def test_the_plugin_registers_its_hooks_with_pytests_terminal_reporter(pytester):
    config = pytester.parseconfigure("-p", progress.PLUGIN)
    hooks = config.pluginmanager.get_plugin("mla_fuse_progress")
    assert isinstance(hooks, progress.PytestProgress) and hooks.terminal is config.pluginmanager.get_plugin(
        "terminalreporter")


ROPE = "test_rotary_embedding:test_rotary_embedding_matches_reference"


def rank3_heads_fail(clock: Clock):
    """A map's ``run_example`` with no kernel: rank-3 queries of more than one head fail; 1 s a case."""
    def run(case):
        clock.now += 1
        if case.rank == 3 and case.heads > 1:
            raise AssertionError("heads past the first wrong")
    return run


def map_with_progress(tmp_path, monkeypatch, shown: progress.Progress, clock: Clock):
    from mla_fuse_conformance.commands.conformance_map.property_map import map_property
    from mla_fuse_conformance.contract.implementation import load_implementation
    from mla_fuse_conformance.running.harness import property_named

    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path))
    counted = progress.Counted(rank3_heads_fail(clock), shown, f"mapping {ROPE}", clock=clock)
    found = map_property(property_named(ROPE), load_implementation("reference"), "cpu", counted, max_examples=20,
                         rounds=2, on_step=counted.step)
    return found, counted


def test_the_map_tells_its_round_and_the_cell_it_is_drawing_as_it_goes(tmp_path, monkeypatch):
    written, clock = [], Clock()
    shown = progress.Progress(written.append, tty=True, clock=clock, width=lambda: 1000)
    found, counted = map_with_progress(tmp_path, monkeypatch, shown, clock)
    title = found.cells[0].title()
    assert len(found.cells) == 1 and "heads > 1: yes" in title, title
    steps = list(dict.fromkeys(line.strip().partition("; now ")[2] for line in written))
    rate = "/".join(map(str, found.cells[0].diagnosis["rate"]))
    assert steps[:3] == ["round 1/2, searching", "round 1/2, cell 1: wrong result, finding its feature values",
                         "round 1/2, cell 1: query rank 3, heads >1, finding its trigger"], steps
    assert steps[3].startswith("round 1/2, cell 1: ") and steps[3].endswith(", measuring its failure rate"), steps
    assert steps[4:] == [f"round 1/2, cell 1: {title} (fails {rate})",
                         f"round 1/2, cell 1: {title}, running it at each value it admits", "round 2/2, searching"], steps
    assert written[-1].strip() == counted.line(step=True) and counted.line().endswith(
        f"{counted.tried} cases tried, {counted.failing} failing, {progress.elapsed(clock.now - 100)}")


def test_piped_the_map_prints_its_step_once_per_30_s_and_a_terminal_line_fits_its_width(tmp_path, monkeypatch):
    written, clock = [], Clock()
    found, counted = map_with_progress(tmp_path, monkeypatch, progress.Progress(written.append, tty=False,
                                                                                clock=clock), clock)
    assert len(written) == 1 + (clock.now - 100) // 30 and all(line.endswith("\n") for line in written), written
    assert written[0] == f"mla-fuse verify: mapping {ROPE}: 0 cases tried, 0 failing, 0:00; now round 1/2, searching\n"
    assert any(f"; now round 1/2, cell 1: " in line for line in written), written
    narrow = []
    progress.Progress(narrow.append, tty=True, width=lambda: 20).update("x" * 50)
    assert narrow == ["\r" + "x" * 19]
