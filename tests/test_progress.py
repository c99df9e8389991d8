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
