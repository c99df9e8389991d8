"""Progress of a long phase: one line rewritten in place (``\\r``) in a terminal; when the output is
not a terminal (a CI log), a line per phase start and end and at most one per ``EVERY`` seconds.

``verify`` reports its map and limits phases through ``Progress``; when its output is not a
terminal it also loads this module into its pytest child (``-p mla_fuse_conformance.commands.progress``),
whose hooks print ``properties done k/N, examples E, elapsed`` every ``EVERY`` seconds (pytest's own
dots stop for as long as one property runs, minutes for some). ``mla-fuse fuzz`` prints its
workers' inputs and failures with the same throttle.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from typing import Callable

import pytest

EVERY = 30.0  # seconds between lines when the output is not a terminal
PLUGIN = __name__  # what ``verify`` passes to its pytest child with ``-p``


@dataclasses.dataclass
class Progress:
    """``write(text)`` writes ``text`` as is (``\\r`` and newlines included); ``tty``: rewrite one line."""

    write: Callable[[str], None]
    tty: bool
    clock: Callable[[], float] = time.monotonic
    every: float = EVERY
    last: float | None = None  # when the last line was written (not a terminal)
    shown: int = 0  # length of the line now shown in place (a terminal)
    width: Callable[[], int] = lambda: shutil.get_terminal_size().columns

    def due(self) -> bool:
        """Whether ``update`` would write now (a state that is costly to gather is gathered only then)."""
        return self.tty or self.last is None or self.clock() - self.last >= self.every

    def update(self, text: str) -> None:
        """The state now: in place in a terminal (cut to its width: a wrapped line cannot be
        rewritten), else a line if ``every`` seconds have passed."""
        if self.tty:
            text = text[:self.width() - 1]
            self.write("\r" + text.ljust(self.shown))
            self.shown = len(text)
        elif self.due():
            self.write(text + "\n")
            self.last = self.clock()

    def phase(self, text: str) -> None:
        """A line that stays (a phase starts or ends): always written."""
        self.write(("\n" if self.shown else "") + text + "\n")
        self.shown, self.last = 0, self.clock()


def elapsed(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


class Counted:
    """``run_example`` of a conformance map, counting the cases it runs and those that fail; ``step``
    is the map's hook (``conformance_map.map_property``'s ``on_step``): the step it is at."""

    def __init__(self, run_example: Callable, progress: Progress, label: str, clock: Callable[[], float] = time.monotonic):
        self.run_example, self.progress, self.label, self.clock = run_example, progress, label, clock
        self.started, self.tried, self.failing, self.now = clock(), 0, 0, ""

    def line(self, step: bool = False) -> str:
        """``mla-fuse verify: mapping P: 130 cases tried, 12 failing, 1:23`` and, with ``step``, ``; now
        round 2/6, cell 3: dtype bfloat16; is_neox yes (fails 4/4)``."""
        return (f"mla-fuse verify: {self.label}: {self.tried} cases tried, {self.failing} failing, "
                f"{elapsed(self.clock() - self.started)}" + (f"; now {self.now}" if step and self.now else ""))

    def step(self, text: str) -> None:
        self.now = text
        self.progress.update(self.line(step=True))

    def __call__(self, case, *args):
        # start-up: `mla-fuse --help` imports this module, and diagnosis.py would add to it (docs/STARTUP.md)
        from mla_fuse_conformance.commands.conformance_map.diagnosis import FAILURES

        self.tried += 1
        try:
            return self.run_example(case, *args)
        except FAILURES:
            self.failing += 1
            raise
        finally:
            self.progress.update(self.line(step=True))


# ---------------------------------------------------------------- the pytest child, not a terminal


def properties_line(done: int, total: int | None, examples: int, seconds: float) -> str:
    return f"mla-fuse verify: properties done {done}/{total if total is not None else '?'}, examples {examples}, " \
           f"elapsed {elapsed(seconds)}"


class PytestProgress:
    """Hooks of verify's pytest child (the xdist controller): a line every ``EVERY`` seconds."""

    def __init__(self, terminal, clock: Callable[[], float] = time.monotonic) -> None:
        self.terminal, self.clock, self.started = terminal, clock, clock()
        self.progress = Progress(self.write, tty=False, clock=clock, last=self.started)
        self.total: int | None = None
        self.done = self.examples = 0
        self.lock, self.stopped = threading.Lock(), threading.Event()

    def write(self, text: str) -> None:
        self.terminal.ensure_newline()
        self.terminal.write(text, flush=True)

    def tick(self) -> None:
        with self.lock:
            self.progress.update(properties_line(self.done, self.total, self.examples, self.clock() - self.started))

    def pytest_collection_finish(self, session) -> None:
        self.total = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self.total = len(ids)

    def pytest_runtest_logreport(self, report) -> None:
        if report.when not in ("setup", "teardown") or (report.when == "setup" and not report.passed):
            metrics = dict(report.user_properties).get("mla_fuse_metrics") or {}
            self.done += 1
            self.examples += int(metrics.get("examples", 0))
            self.tick()

    def pytest_sessionstart(self, session) -> None:
        threading.Thread(target=self.watch, name="mla-fuse-progress", daemon=True).start()

    def watch(self) -> None:
        while not self.stopped.wait(self.progress.every / 6):
            self.tick()

    def pytest_sessionfinish(self, session) -> None:
        self.stopped.set()


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config) -> None:
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if hasattr(config, "workerinput") or terminal is None:  # an xdist worker reports to the controller
        return
    config.pluginmanager.register(PytestProgress(terminal), "mla_fuse_progress")
