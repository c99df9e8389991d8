"""Run property examples in a child process, so a kernel that crashes cannot take the caller down.

``Executor`` keeps one child process that loads the implementation once and runs the examples
sent to it: the caller (hypothesis in the conformance map, ``mla-fuse repro``) never runs a
kernel itself. A crash (segfault, abort, illegal instruction, a device error that kills the
process) becomes a ``Crashed`` failure naming the signal, and so does a hang (no result within
``recording.example_timeout()`` seconds of the request or of the child's last progress, a program its
interpreted kernels started: ``interpreter_watch.py``; the child is killed). After any example that failed or
raised, the next one gets a new child: a kernel that wrote out of bounds may have corrupted its
process (heap, OpenMP state), and a later example must not crash or hang for it. A crashing case
is shrunk like any other failure.

Children come from a ``multiprocessing`` fork server that has imported torch and the suite once,
so a new child after a crash costs milliseconds, not an interpreter start (and a child never
inherits a used OpenMP pool or a CUDA context: the server runs no kernel). Outcomes come back on
the child's own pipe: ``passed``, ``failed`` (an AssertionError: a wrong result), ``raised`` (any
other exception from the kernel), ``rejected`` (outside the declared limits, or a corruption that
does not apply) or ``not provided``. ``Executor.outputs`` runs one operation on a case as it is and
also brings back the memory it left (``running/outputs.py``, for ``mla-fuse compare``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Callable

import torch
from hypothesis.errors import UnsatisfiedAssumption

from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.declarations.property_modules import KERNEL_PROPERTY_MODULES, qualified
from mla_fuse_conformance.running import recording


class Crashed(Exception):
    """The process running the example died (``signal``: its name, e.g. SIGSEGV, or the exit code)."""

    def __init__(self, how: str) -> None:
        super().__init__(f"the kernel crashed the process running the example ({how})")
        self.how = how


class Hung(Crashed):
    """The example gave no result within the time limit; the process running it was killed."""

    def __init__(self, seconds: float) -> None:
        Exception.__init__(self, f"no result in {seconds:g} s (${recording.TIMEOUT_ENV}): the process running the "
                                 "example was killed")
        self.how = f"hung: no result in {seconds:g} s"


class OutOfTime(BaseException):
    """The caller's time budget ran out (``verify --map-seconds``), before or while an example ran:
    the map stops where it is. Not the example's outcome (no crash, no hang counted), and a
    BaseException, as KeyboardInterrupt: hypothesis and ``except Exception`` let it through."""


class RaisedInChild(Exception):
    """The implementation raised ``original_type`` (not an assertion of the suite)."""

    def __init__(self, original_type: str, message: str) -> None:
        super().__init__(message)
        self.original_type = original_type


class ChildNotProvided(Exception):
    """The implementation does not provide an operation the property needs (a skip)."""


def crash_description(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


PRELOAD = ["torch", "mla_fuse_conformance.running.harness", *map(qualified, KERNEL_PROPERTY_MODULES)]


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


CHECK_EVERY = 0.5  # seconds between the caller's ``check`` calls while an example runs


class Executor:
    """A child process running examples of ``impl_spec`` on ``device`` (see the module docstring).
    ``check``: called before each example and every ``CHECK_EVERY`` seconds while one runs; what it
    raises stops the caller there (``verify``'s map stopped by a signal: the example running is killed)."""

    def __init__(self, impl_spec: str, device: str, require: tuple[str, ...] = (),
                 check: Callable[[], None] | None = None) -> None:
        self.impl_spec, self.device, self.require, self.check = impl_spec, device, require, check
        self.process = self.connection = None
        self.crashes = 0

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        context = _context()
        self.connection, child_end = context.Pipe()
        self.progress = context.Value("d", 0.0, lock=False)  # the child's last progress (interpreter_watch.py)
        self.process = context.Process(target=_serve, args=(child_end, self.impl_spec, self.device, self.require,
                                                            os.getcwd(), self.progress), daemon=True)
        self.process.start()
        child_end.close()

    def _discard(self) -> int | None:
        """Forget a child that died or was killed; its exit code."""
        self.process.join()
        returncode = self.process.exitcode
        self.connection.close()
        self.process = self.connection = None
        return returncode

    def close(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.connection.send(None)
            self.process.join(timeout=10)
            if self.process.is_alive():  # stuck on its way out (a corrupted process)
                self.process.kill()
                self.process.join()
        if self.connection is not None:
            self.connection.close()
        self.process = self.connection = None

    def kill(self) -> None:
        """End the child now, whatever it is running (``verify`` stopped by a signal)."""
        if self.process is not None:
            self.process.kill()
            self._discard()

    def run(self, prop_name: str, case, within_limits: bool = True, budget: float | None = None,
            served: str | None = None) -> None:
        """Run one example; raise what it raised (see the module docstring), inside hypothesis too.
        ``within_limits=False``: a case outside the declared limits, on purpose (limit checks); ``served``:
        a deployment of an engine layout the implementation serves, run as it is (``harness.PropertyRun``).
        ``budget``: the seconds the caller has left; an example still running when they are spent is
        killed and ``OutOfTime`` raised (none left: raised before it starts)."""
        # deferred: a measured start-up cost of this module's importers (docs/STARTUP.md)
        from mla_fuse_conformance.running.harness import property_named

        if self.check is not None:
            self.check()
        if budget is not None and budget <= 0:
            raise OutOfTime()
        factor = getattr(property_named(prop_name), "timeout_factor", 1)  # compile examples take longer
        self._ask({"property": prop_name, "case": case_types.to_jsonable(case), "within_limits": within_limits,
                   "served": served},
                  recording.example_timeout() * factor or None, budget)

    def outputs(self, operation: str, case) -> dict:
        """Run ``operation`` on ``case`` as it is (no projection) against the reference; raise like
        ``run``, else return the memory it left (``running/outputs.py``: ``mla-fuse compare``)."""
        return self._ask({"operation": operation, "case": case_types.to_jsonable(case)},
                         recording.example_timeout() or None)["outputs"]

    def _wait(self, seconds: float, stall: float | None = None) -> str | None:
        """None when the child's reply came within ``seconds`` (``inf``: no limit) and without ``stall`` seconds
        with no progress (from the request or the child's last progress: a program its interpreted kernels
        started); else ``"budget"`` or ``"stall"``, whichever came first. ``check`` is called every
        ``CHECK_EVERY`` seconds meanwhile (what it raises goes through: the caller kills the child)."""
        started = time.monotonic()
        end = started + seconds

        def stalled_at() -> float:
            return float("inf") if stall is None else max(started, self.progress.value) + stall

        while not self.connection.poll(max(0.0, min(CHECK_EVERY, end - time.monotonic(),
                                                     stalled_at() - time.monotonic()))):
            now = time.monotonic()
            if now >= min(end, stalled_at()):
                return "budget" if end <= stalled_at() else "stall"
            if self.check is not None:
                self.check()
        return None

    def _ask(self, request: dict, timeout: float | None, budget: float | None = None) -> dict:
        """Send ``request`` to the child; its reply, or the exception the outcome stands for."""
        if self.process is None or not self.process.is_alive():
            self._start()
        try:
            self.connection.send(request)
            ended = self._wait(float("inf") if budget is None else budget, timeout)
            if ended is not None:
                if ended == "budget":
                    self.kill()  # the caller's time, not the example's: no outcome
                    raise OutOfTime()
                self.process.kill()
                self._discard()
                self.crashes += 1
                raise Hung(timeout)
            result = self.connection.recv()
        except (EOFError, OSError, BrokenPipeError):
            returncode = self._discard()
            self.crashes += 1
            raise Crashed(crash_description(returncode)) from None
        status = result["status"]
        if status == "passed":
            return result
        if status in ("failed", "raised"):
            # it may have come with stray writes (a kernel writing out of bounds corrupts its own
            # process's heap): the next example gets a clean child, so what it does is its own
            self.close()
        if status == "failed":
            raise AssertionError(result["message"])
        if status == "raised":
            raise RaisedInChild(result["type"], result["message"])
        if status == "rejected":
            raise UnsatisfiedAssumption(result.get("message") or "")  # (what hypothesis' reject() raises)
        raise ChildNotProvided(result["message"])


# ---------------------------------------------------------------- the child


def _serve(connection, impl_spec: str, device_name: str, require: tuple[str, ...], cwd: str, progress) -> None:
    # deferred: the child's imports, a measured start-up cost of this module's importers (docs/STARTUP.md);
    # the fork server has imported the harness already (PRELOAD)
    from mla_fuse_conformance.contract.implementation import load_implementation
    from mla_fuse_conformance.running import outputs
    from mla_fuse_conformance.running.harness import NotProvided, property_named

    os.chdir(cwd)
    impl = load_implementation(impl_spec, require)
    device = torch.device(device_name)
    recorder = recording.Recorder(heartbeat=lambda: setattr(progress, "value", time.monotonic()))
    while (request := connection.recv()) is not None:
        # the property first: importing its module registers its case type (a CompileCase)
        prop = property_named(request["property"]) if "property" in request else None
        case = case_types.from_jsonable(request["case"])
        try:
            if prop is None:  # mla-fuse compare: the memory after the call comes back
                reply = {"status": "passed", "outputs": outputs.capture(impl, device, request["operation"], case)}
            else:
                prop.run(impl, device, case, request["within_limits"], recorder, request.get("served"))
                reply = {"status": "passed"}
        except AssertionError as error:
            reply = {"status": "failed", "message": str(error)}
        except UnsatisfiedAssumption as reason:  # outside the limits, or not judged (too slow to interpret)
            reply = {"status": "rejected", "message": str(reason)}
        except NotProvided as reason:
            reply = {"status": "not provided", "message": str(reason)}
        except Exception as error:  # noqa: BLE001 - what the kernel raised is the finding
            reply = {"status": "raised", "type": getattr(error, "original_type", type(error).__name__),
                     "message": str(error).strip()[-4000:]}
        connection.send(reply)
        if device.type == "cuda" and reply["status"] == "raised" and "cuda" in (reply["type"] + reply["message"]).lower():
            break  # a CUDA error can leave the context unusable: the next example gets a new child
