"""A ``verify`` stopped by SIGTERM or SIGINT (a CI job's time limit, Ctrl-C) still leaves its verdict.

- While the properties run (the pytest child): the signal ends the child (terminated, killed if it
  outlasts ``GRACE`` seconds) and ``verify`` exits 2 with one line: no verdict yet.
- While the map runs (``maps.py``): the signal is noted, and the map stops at its next check, before
  each example and every ``executor.CHECK_EVERY`` seconds while one runs (the example killed):
  ``check`` raises ``Stopped`` there. ``verify`` rewrites report.json and its views from what was
  mapped, the map recorded as stopped, and exits with the verdict the properties gave. A second
  signal while that is written is noted, not obeyed. The handler itself raises nothing: an
  exception raised where a signal happens to land can be swallowed (inside a finalizer Python
  prints it and goes on), and the map then ran on to its end.

The handlers are the parent's, installed for those two phases only and restored after.
"""

from __future__ import annotations

import signal
import subprocess
import time

SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACE = 10.0  # seconds a terminated pytest child has to end before it is killed


class Stopped(BaseException):
    """A signal stopped the map (a BaseException, as KeyboardInterrupt: ``except Exception`` lets it through)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Handled:
    """Within ``with``: SIGTERM and SIGINT noted in ``signal`` and handled by ``on_signal(name)`` (the
    first one; later ones are only counted); the handlers found are restored on leaving."""

    def __init__(self, on_signal=lambda name: None) -> None:
        self.on_signal, self.signal, self.previous = on_signal, None, {}

    def __enter__(self) -> "Handled":
        for number in SIGNALS:
            self.previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number, frame) -> None:
        if self.signal is not None:
            return
        self.signal = signal.Signals(number).name
        self.on_signal(self.signal)

    def __exit__(self, *exc) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def raise_if_signalled(self) -> None:
        """The map's check (``executor.Executor``'s ``check``): ``Stopped`` once a signal came."""
        if self.signal is not None:
            raise Stopped(self.signal)


def run_child(command: list[str], env: dict, announce=lambda: None) -> tuple[int | None, str | None]:
    """``announce()`` then run the pytest child in the foreground; its exit status (None: a signal came
    before it started), and the signal that stopped it (the child terminated) or None."""
    children, stopped_at = [], []

    def stop(name: str) -> None:
        stopped_at.append(time.monotonic())
        for child in children:
            child.terminate()

    with Handled(stop) as handled:
        announce()
        if handled.signal is None:
            children.append(subprocess.Popen(command, env=env))
        if not children:
            return None, handled.signal
        if handled.signal:  # came while it was starting
            children[0].terminate()
        while True:
            try:
                return children[0].wait(timeout=1.0), handled.signal
            except subprocess.TimeoutExpired:
                if stopped_at and time.monotonic() - stopped_at[0] > GRACE:  # terminated, still running
                    children[0].kill()
