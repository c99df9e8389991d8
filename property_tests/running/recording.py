"""What the properties leave behind: failure files for replay, in-flight examples, and metrics.

Failures. The last failing example of a property (hypothesis replays the shrunk one last) is
kept here; the suite's pytest plugin writes it to ``$MLA_FUSE_FAILURE_DIR`` (default
``.mla_fuse_failures/`` under the current directory) as a small JSON file: property,
implementation, device, the case with its seed, its feature values and how it failed (a wrong
result, what the kernel raised, or a crash) and the directories an outside adapter imports from
(``import_path``). ``mla-fuse repro FILE`` replays it without hypothesis, from any directory; every
command printed for it (``replay_command``, ``pytest_command``) runs as printed from any directory.

In-flight examples. Before an example runs it is written to ``inflight_path()``; a process that
dies (segfault, device error) leaves it there, and the plugin turns it into a failure file. When
the example ends, the file moves to ``finished_path()``: a process that dies between examples
(a kernel's stray write found later by the allocator) is blamed on the example that ran last.
A hang is a death too: while an example runs, ``faulthandler`` is armed to dump every thread's
stack next to the in-flight file and end the process after ``example_timeout()`` seconds
(``$MLA_FUSE_EXAMPLE_TIMEOUT``, default 120, 0: never), so a kernel that deadlocks (a corrupted
OpenMP barrier, a spinning device kernel) becomes a "hung" failure of its case, not a stuck run.
Under Triton's interpreter the timer restarts at each program a kernel starts, and an example whose
launches are estimated past its budget is not judged (``interpreter_watch.py``).

Metrics. Each property's ``PropertyStats`` (examples, worst rope error as a fraction of the
CONTRACT §5 bound and in ulps, worst fp8 code distance, padded and saturated cases, and ``axes``:
the examples per feature value) travel on the pytest report (``user_properties``) to the plugin,
which writes them to ``outcomes.jsonl`` under ``$MLA_FUSE_REPORT_DIR`` for ``mla-fuse verify``.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shlex
import site
import sys
import sysconfig
from typing import Callable

import hypothesis

from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.declarations.options import replay_environment
from mla_fuse_conformance.running import failure_text, interpreter_watch
from mla_fuse_conformance.settings import database, profiles

FAILURE_DIR_ENV = "MLA_FUSE_FAILURE_DIR"
REPORT_DIR_ENV = "MLA_FUSE_REPORT_DIR"
OUTCOMES_FILE = "outcomes.jsonl"  # one JSON line per test outcome, under $MLA_FUSE_REPORT_DIR (running.session_report.SessionReport)
TIMEOUT_ENV = "MLA_FUSE_EXAMPLE_TIMEOUT"
DEFAULT_EXAMPLE_TIMEOUT = 120.0  # seconds; the slowest ci/gpu example under the interpreter takes ~20 s loaded


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a process stopped mid-write leaves the old file."""
    path = pathlib.Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def example_timeout() -> float:
    """Seconds one example may run before it counts as hung (``$MLA_FUSE_EXAMPLE_TIMEOUT``; 0: never)."""
    return interpreter_watch.seconds_setting(TIMEOUT_ENV, DEFAULT_EXAMPLE_TIMEOUT)


def finished_path(inflight: pathlib.Path) -> pathlib.Path:
    """Where the in-flight file goes once its example has finished: a process that dies between
    examples (a heap that a kernel corrupted found at a later ``free``) leaves the likely culprit."""
    return inflight.with_suffix(".finished")  # not *.json: not a failure file


def stacks_path(inflight: pathlib.Path) -> pathlib.Path:
    """Where a hung example's thread stacks go (beside its in-flight file)."""
    return inflight.with_suffix(".stacks.txt")


def failure_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(FAILURE_DIR_ENV) or ".mla_fuse_failures").absolute()


def worker_name() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


INFLIGHT_ENV = "MLA_FUSE_INFLIGHT_FILE"


def inflight_path(worker: str | None = None) -> pathlib.Path:
    """Where the example about to run is written (``$MLA_FUSE_INFLIGHT_FILE``, else per worker in
    the failure directory): what is left there after a crash is the crashing case."""
    if worker is None and os.environ.get(INFLIGHT_ENV):
        return pathlib.Path(os.environ[INFLIGHT_ENV])
    return failure_dir() / f"inflight-{worker or worker_name()}.json"


def failure_kind(error: BaseException) -> str:
    """How an example failed: a wrong result (a CONTRACT §5 comparison), what the kernel raised, or
    a crash (``executor.Crashed``)."""
    if type(error).__name__ == "RequiredOperationMissing":
        return "required operation missing"
    if isinstance(error, AssertionError):
        return "wrong result"
    if hasattr(error, "how"):
        return error.how if error.how.startswith("hung") else f"crashed ({error.how})"
    return f"raised {getattr(error, 'original_type', type(error).__name__)}"


def failure_record(prop, impl, device, case, error: BaseException) -> dict:
    """What a failure file holds (before ``save_failure`` adds the replay commands)."""
    return dict(Recorder.record(prop, impl, device, case), kind=failure_kind(error),
                error_type=getattr(error, "original_type", type(error).__name__), error=str(error)[:4000],
                **getattr(error, "mla_fuse_record", {}))  # what a check adds (a planted pass mutant)


@dataclasses.dataclass
class PropertyStats:
    property: str
    operations: tuple[str, ...]
    impl: str
    variant: str | None = None  # the corruption of a bad-input property
    examples: int = 0
    failed_examples: int = 0
    worst_rope_ulps: float = 0.0
    worst_rope_bound_fraction: float = 0.0  # |impl - exact| / CONTRACT §5 bound; above 1 fails
    worst_fp8_code_diff: int = 0
    padded_slot_cases: int = 0
    saturation_cases: int = 0
    axes: dict = dataclasses.field(default_factory=dict)  # {axis: {value: examples}}: what the examples exercised
    not_judged: int = 0  # examples too slow under Triton's interpreter (interpreter_watch.py): neither pass nor fail
    not_judged_estimate: float = 0.0  # the largest estimate among them, in seconds

    def exercised(self, found: dict[str, str]) -> None:
        """Count one example's feature values (``features.features``)."""
        for axis, value in found.items():
            values = self.axes.setdefault(axis, {})
            values[value] = values.get(value, 0) + 1

    def as_record(self, outcome: str) -> dict:
        record = dataclasses.asdict(self)
        record["operations"] = list(self.operations)
        record["worst_rope_ulps"] = round(self.worst_rope_ulps, 4)
        record["worst_rope_bound_fraction"] = round(self.worst_rope_bound_fraction, 4)
        record["outcome"] = outcome
        return record


class Recorder:
    """The examples of the property being run: its metrics, its last failure and, with
    ``track_inflight`` (the plugin's recorder), each example saved before it runs. The plugin
    holds one per session (``config.stash``); runs outside pytest make their own."""

    def __init__(self, track_inflight: bool = False, heartbeat: Callable[[], None] | None = None) -> None:
        """``heartbeat``: called as an example's interpreted kernels make progress (``interpreter_watch.py``;
        the executor's child tells its parent); with ``track_inflight`` the hang timer restarts then too."""
        self.track_inflight = track_inflight
        self.watch = interpreter_watch.InterpreterWatch(lambda: self._progress(heartbeat)).install()
        self._timeout = 0.0
        self.reset()

    def _progress(self, heartbeat: Callable[[], None] | None) -> None:
        if heartbeat is not None:
            heartbeat()
        if self.track_inflight and self._timeout and self._stacks is not None and not self._stacks.closed:
            faulthandler.dump_traceback_later(self._timeout, exit=True, file=self._stacks)

    def reset(self) -> None:
        self.stats: PropertyStats | None = None
        self.last_failure: dict | None = None
        self.nodeid: str | None = None

    def stats_for(self, prop, impl, variant: str | None = None) -> PropertyStats:
        if self.stats is None or (self.stats.property, self.stats.variant) != (prop.name, variant):
            self.stats = PropertyStats(prop.name, prop.operations, impl.spec, variant)
        return self.stats

    def observe(self, outcome) -> None:
        """Fold one comparison's measurements (comparisons.Outcome) into the property's metrics."""
        if self.stats is not None:
            self.stats.worst_rope_ulps = max(self.stats.worst_rope_ulps, outcome.worst_rope_ulps)
            self.stats.worst_rope_bound_fraction = max(self.stats.worst_rope_bound_fraction,
                                                       outcome.worst_rope_bound_fraction)
            self.stats.worst_fp8_code_diff = max(self.stats.worst_fp8_code_diff, outcome.worst_fp8_code_diff)

    _stacks = None  # the open file faulthandler writes a hung example's stacks to

    def starting(self, prop, impl, device, case) -> None:
        """Save the example before it runs, so a crash (segfault, device error) leaves it behind,
        and arm the hang watchdog (see the module docstring). Its feature values are counted
        (a bad-input example's are not: its operation refuses it)."""
        if self.stats is not None and not isinstance(case, case_types.BadInputCase):
            from mla_fuse_conformance.cases.features import features  # deferred: torch (docs/STARTUP.md)

            self.stats.exercised(features(case, prop.rotates))
        self.watch.start(interpreter_watch.budget(getattr(prop, "timeout_factor", 1)))
        if self.track_inflight:
            path = inflight_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            record = self.record(prop, impl, device, case)
            timeout = example_timeout() * getattr(prop, "timeout_factor", 1)  # compile examples: longer
            self._timeout = timeout
            record.update(nodeid=self.nodeid, pid=os.getpid(), timeout=timeout)
            path.write_text(json.dumps(record, sort_keys=True))
            if timeout:
                if self._stacks is None or self._stacks.closed:
                    self._stacks = open(stacks_path(path), "w")  # noqa: SIM115 - faulthandler needs it open
                faulthandler.dump_traceback_later(timeout, exit=True, file=self._stacks)

    def finished(self) -> None:
        self.watch.stop()
        if self.track_inflight:
            faulthandler.cancel_dump_traceback_later()
            path = inflight_path()
            try:  # never a failure of the example: another process sharing the file may have moved it
                os.replace(path, finished_path(path))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """The end of this process's session: nothing of its examples is left in the failure directory."""
        if self.track_inflight:
            faulthandler.cancel_dump_traceback_later()
            path = inflight_path()
            if self._stacks is not None:
                self._stacks.close()
            for leftover in (path, finished_path(path), stacks_path(path)):
                leftover.unlink(missing_ok=True)

    def failed(self, prop, impl, device, case, error: BaseException) -> None:
        """Keep the failure record of ``case``, and tie it to ``error``: the example hypothesis reports is
        found from its exception (``failure_text.reported``), not taken to be the last one that failed."""
        self.last_failure = failure_record(prop, impl, device, case, error)
        failure_text.attach(error, self.last_failure)

    @staticmethod
    def record(prop, impl, device, case) -> dict:
        from mla_fuse_conformance.cases.features import features  # deferred: torch (docs/STARTUP.md)

        base = getattr(case, "base", case)
        return {"property": prop.name, "operations": list(prop.operations), "impl": impl.spec, "device": str(device),
                "case": case_types.to_jsonable(case), "features": features(base, prop.rotates)}



def python_command() -> str:
    """The interpreter running now, as a printed command calls it: always its absolute path, shell-quoted
    (``sys.executable``, not resolved: a venv's ``bin/python`` stays the venv's). A bare ``python`` ran
    whatever a new shell finds first (in a fresh shell: a Python without the suite, which exited 1 with
    ``No module named mla_fuse_conformance``, the status ``repro`` uses for "reproduced")."""
    return shlex.quote(os.path.abspath(sys.executable) if sys.executable else "python3")


def adapter_directory(spec: str | None) -> str | None:
    """The directory an outside adapter's module was imported from (the ``sys.path`` entry that
    holds it), unless installed packages live there: what a command run from another directory
    needs on ``PYTHONPATH``. None for the registered implementations and the suite's own modules."""
    from mla_fuse_conformance.contract.implementation import BUILT_IN  # deferred: torch (docs/STARTUP.md)

    if not spec or spec in BUILT_IN or spec.startswith("mutant:") or ":" not in spec:
        return None
    module_name = spec.partition(":")[0]
    if module_name.partition(".")[0] in ("mla_fuse", "mla_fuse_conformance", "mla_fuse_reference"):
        return None
    origin = getattr(sys.modules.get(module_name), "__file__", None)
    if origin is None:  # not imported by this process: where it would be imported from
        try:
            origin = getattr(importlib.util.find_spec(module_name), "origin", None)
        except (ImportError, ValueError):
            return None
    if not origin or not os.path.isfile(origin):
        return None
    path = pathlib.Path(origin).absolute()
    root = path.parents[module_name.count(".") + (path.name == "__init__.py")]
    return None if root in installed_directories() else str(root)


def installed_directories() -> set[pathlib.Path]:
    """Where this interpreter's installed packages and standard library live."""
    paths = sysconfig.get_paths()
    found = [*site.getsitepackages(), site.getusersitepackages(),
             *(paths[name] for name in ("purelib", "platlib", "stdlib", "platstdlib"))]
    return {pathlib.Path(each).absolute() for each in found}


def import_path(spec: str | None) -> list[str]:
    """The ``PYTHONPATH`` a printed command carries so that it runs from any directory: the outside
    adapter's directory (``adapter_directory``), then this run's ``PYTHONPATH``, absolute, without the
    entries a new shell does not need (directories that do not exist, the interpreter's own installed
    packages and standard library). Empty, and no ``PYTHONPATH=`` printed, where the run had none and
    the implementation is built in or installed: the interpreter's absolute path alone then imports the
    suite, installed editable or not."""
    entries = [adapter_directory(spec), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    installed = installed_directories()
    absolute = (pathlib.Path(entry).absolute() for entry in entries if entry)
    return list(dict.fromkeys(str(path) for path in absolute if path.is_dir() and path not in installed))


def assignments(variables: dict[str, str]) -> str:
    """``NAME=VALUE `` for each variable, shell-quoted, in order: what a printed command sets before it runs."""
    return "".join(f"{name}={shlex.quote(value)} " for name, value in variables.items())


def python_with(pythonpath: list[str]) -> str:
    """``[PYTHONPATH=DIRS ]/abs/python``: how a printed command starts (``python_command``)."""
    return assignments({"PYTHONPATH": os.pathsep.join(pythonpath)} if pythonpath else {}) + python_command()


def recorded_import_path(record: dict | None) -> list[str]:
    """The ``PYTHONPATH`` of a failure record (``import_path`` when it was saved; files written before
    it was recorded: this run's)."""
    if record is not None and "pythonpath" in record:
        return record["pythonpath"]
    return import_path(record.get("impl") if record else None)


def replay_command(path: pathlib.Path, record: dict | None = None) -> str:
    """``mla-fuse repro FILE`` as it runs from any directory: the file's absolute path, after the
    ``PYTHONPATH`` the file records (``record``, else read from ``path``) and the variables it records
    (``environment``: ``replay_environment``)."""
    if record is None:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = None
    shown = str(pathlib.Path(path).absolute())
    environment = assignments((record or {}).get("environment", {}))
    return (f"{environment}{python_with(recorded_import_path(record))} -m mla_fuse_conformance repro "
            f"{shlex.quote(shown)}")


def save_failure(failure: dict, nodeid: str, profile: str) -> pathlib.Path:
    """Write ``failure`` (from ``Recorder.failed``) as a replayable file; return its path."""
    text = json.dumps(failure["case"], sort_keys=True)
    digest = hashlib.sha1((failure["property"] + failure["impl"] + text).encode()).hexdigest()[:10]
    short = failure["property"].rpartition(":")[2]
    name = f"{short}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', failure['impl'])}-{digest}.json"
    directory = failure_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    record = dict(failure, nodeid=nodeid, profile=profile, hypothesis_version=hypothesis.__version__,
                  pythonpath=recorded_import_path(failure))  # `mla-fuse repro FILE` imports the adapter from it
    environment = replay_environment(os.environ)
    if environment:
        record["environment"] = environment
    record["replay"] = replay_command(path, record)
    record["pytest"] = pytest_command(record, nodeid, profile)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def pytest_command(failure: dict, nodeid: str, profile: str) -> str:
    """The property's pytest item, addressed through the installed suite so it runs from anywhere; under a
    profile with an example database in a directory (not derandomized), that directory by its absolute
    path (``$MLA_FUSE_HYPOTHESIS_DB``; the default one is relative to the run's directory)."""
    module, _, function = failure["property"].partition(":")
    item = function + (nodeid.partition("::" + function)[2] if "::" + function in nodeid else "")
    environment = assignments(failure.get("environment", replay_environment(os.environ)))
    return (f"{database_prefix(profile)}{environment}{python_with(recorded_import_path(failure))} -m pytest --pyargs "
            f"{shlex.quote(f'mla_fuse_conformance.properties.{module}::{item}')} "
            f"--mla-fuse-impl={shlex.quote(failure['impl'])} --hypothesis-profile={shlex.quote(profile)}")


def database_prefix(profile: str) -> str:
    """``MLA_FUSE_HYPOTHESIS_DB=DIR `` where ``profile`` is one of the suite's that keeps an example database
    and the database is a directory, else "" (``mla_fuse.ci`` is derandomized and regenerates the case; a
    Redis URL is left to the shell, its password unprinted; another profile's database is not ours)."""
    url = os.environ.get(database.DATABASE_ENV_VAR)
    if profile not in map(profiles.full_name, profiles.NAMES) or profile == profiles.full_name("ci") \
            or database.is_redis_url(url):
        return ""
    directory = pathlib.Path(url) if url else database.DEFAULT_DIRECTORY
    return assignments({database.DATABASE_ENV_VAR: str(directory.absolute())})


def describe_failure(failure: dict, path: pathlib.Path, nodeid: str, profile: str) -> str:
    """The text shown under a failing property: what failed, seed, the one case (``failure_text.case_note``:
    which it is), the worst elements of a wrong result, and how to replay it."""
    from mla_fuse_conformance.cases.features import describe  # deferred: torch (docs/STARTUP.md)

    case = case_types.from_jsonable(failure["case"])
    seed = case.base.seed if isinstance(case, case_types.BadInputCase) else case.seed
    worst = failure_text.worst_lines(failure.get("error"))
    return "\n".join([
        f"implementation: {failure['impl']}   device: {failure['device']}   case seed: {seed}",
        f"failure:        {failure.get('kind', 'failed')} on {describe(failure.get('features', {}))}",
        *(f"{'worst:' if not index else '':16}{line}" for index, line in enumerate(worst)),
        f"case:           {case!r}",
        *(f"{'':16}{line}" for line in failure_text.case_note(failure)),
        f"saved to:       {pathlib.Path(path).absolute()}",
        f"replay exactly: {replay_command(path)}",
        f"or with pytest: {pytest_command(failure, nodeid, profile)}",
        "                # derandomized profiles regenerate the case; others replay it from the example database",
        f"keep it:        add {case!r} to the property's examples=[...] (names from mla_fuse_conformance.cases.types)",
    ])
