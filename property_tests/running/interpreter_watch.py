"""No verdict from the interpreter's speed: progress and cost of Triton's interpreter, per example.

Under Triton's interpreter a launch runs its programs one after another in Python, so it costs about its
program count times a per-program time (the rope of 65,537 tokens: one program a token, minutes). A fixed
example limit called such a launch "hung"; the kernel was working. The watch tells the two apart by the
programs the interpreter starts (Triton 3.6-3.9 announce each with ``interpreter_builder.set_grid_idx``,
after ``set_grid_dim`` for the launch; ``InterpreterWatch.install`` wraps both on that object):

* **progress**: each program started calls ``heartbeat`` (at most every ``HEARTBEAT_SECONDS``); the hang
  watchdogs count from the last one (``recording.Recorder``'s faulthandler timer under pytest, the
  executor's wait in ``mla-fuse verify``'s maps and ``repro``), so an example is hung when it made no
  progress for ``$MLA_FUSE_EXAMPLE_TIMEOUT`` seconds (a program that never ends: a kernel that spins),
  however long its kernels keep starting programs;
* **cost**: once a launch has run ``MIN_PROGRAMS`` programs for ``MIN_SECONDS``, its remaining programs
  are estimated at the mean time per program so far. When the example's time so far plus that estimate
  exceeds its budget (``budget()``: ``$MLA_FUSE_INTERPRETER_BUDGET`` seconds, default 600, times the
  property's timeout factor), ``TooSlowUnderInterpreter`` is raised in the launching thread: the example
  is **not judged** (``harness.PropertyRun.example`` counts it and rejects it), never a failure or a pass.

Work outside a launch (building a case, the float64 reference) starts no program: the hang watchdog
treats it as before, one example timeout from the example's start or its last program. A single program
that runs longer than the example timeout by itself (a loop inside one program) is called hung.
"""

from __future__ import annotations

import os
import time
from typing import Callable

BUDGET_ENV = "MLA_FUSE_INTERPRETER_BUDGET"
DEFAULT_BUDGET = 600.0
MIN_PROGRAMS = 8
MIN_SECONDS = 1.0
HEARTBEAT_SECONDS = 0.5


class TooSlowUnderInterpreter(BaseException):
    """The example cannot finish inside its budget under Triton's interpreter (a BaseException, so that
    neither the interpreter's ``except Exception`` nor a kernel's wrapper turns it into a failure)."""

    def __init__(self, estimated: float, budget: float, programs: int) -> None:
        super().__init__(f"not judged: too slow under the interpreter (estimated {estimated:.0f} s, over the "
                         f"budget of {budget:g} s: a launch of {programs} programs)")
        self.estimated, self.budget, self.programs = estimated, budget, programs


def seconds_setting(name: str, default: float) -> float:
    """A number of seconds from ``$name`` (``default`` when unset or empty; 0: no limit), or a ValueError
    naming the variable (also ``recording.example_timeout``'s)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds (0: no limit), got {text!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0 seconds (0: no limit), got {text!r}")
    return value


def budget(factor: int = 1) -> float:
    """Seconds an example may be estimated to take under the interpreter (``$MLA_FUSE_INTERPRETER_BUDGET``
    times ``factor``; 0: no estimate is acted on)."""
    return seconds_setting(BUDGET_ENV, DEFAULT_BUDGET) * factor


class InterpreterWatch:
    """One process's watch over the interpreter (the module docstring); one example at a time."""

    def __init__(self, heartbeat: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic):
        self.heartbeat, self.clock = heartbeat, clock
        self.example_budget = 0.0
        self.example_started = self.launch_started = self.last_beat = 0.0
        self.programs = self.started = 0
        self.active = False

    def install(self) -> "InterpreterWatch":
        """Wrap the interpreter's grid announcements (once per process: a later watch replaces the earlier)."""
        try:  # deferred: a measured start-up cost (the command line imports this module; docs/STARTUP.md)
            from triton.runtime import interpreter
        except ImportError:  # no Triton: nothing is interpreted
            return self
        builder = interpreter.interpreter_builder
        wrapped = getattr(builder, "mla_fuse_watch", None)
        if wrapped is None:
            set_grid_dim, set_grid_idx = builder.set_grid_dim, builder.set_grid_idx

            def grid_dim(nx, ny, nz):
                builder.mla_fuse_watch.launch(nx * ny * nz)
                return set_grid_dim(nx, ny, nz)

            def grid_idx(x, y, z):
                builder.mla_fuse_watch.program()
                return set_grid_idx(x, y, z)

            builder.set_grid_dim, builder.set_grid_idx = grid_dim, grid_idx
        builder.mla_fuse_watch = self
        return self

    def start(self, seconds: float) -> None:
        """An example starts, with ``seconds`` of budget (0: no estimate acted on)."""
        self.example_budget, self.active = seconds, True
        self.example_started = self.last_beat = self.clock()

    def stop(self) -> None:
        self.active = False

    def launch(self, programs: int) -> None:
        self.programs, self.started, self.launch_started = programs, 0, self.clock()

    def program(self) -> None:
        if not self.active:
            return
        self.started += 1
        now = self.clock()
        if now - self.last_beat >= HEARTBEAT_SECONDS:
            self.last_beat = now
            self.heartbeat()
        spent = now - self.launch_started
        if self.example_budget and self.started >= MIN_PROGRAMS and spent >= MIN_SECONDS:
            estimated = now - self.example_started + (self.programs - self.started) * spent / self.started
            if estimated > self.example_budget:
                self.active = False
                raise TooSlowUnderInterpreter(estimated, self.example_budget, self.programs)
