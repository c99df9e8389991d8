"""This repository's own tests: they use the suite's modules directly, under the suite's profile,
and the mutation self-tests report a table at the end of the session.

``mutant_results`` appends one row per mutant to a file of this session (named by the xdist
controller and handed to its workers); the table is printed in the terminal summary.
"""

from __future__ import annotations

import json
import pathlib
import uuid

import pytest

_ROWS = pytest.StashKey[pathlib.Path]()
_WORKER_KEY = "mla_fuse_mutant_rows"
NIGHTLY = "nightly"


def pytest_addoption(parser):
    parser.addoption("--nightly", action="store_true", default=False,
                     help="run only the tests marked nightly (left out of every other run: ci/nightly.sh tests)")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``nightly`` are deselected unless ``--nightly``, which selects them alone: second
    real end-to-end runs of a mechanism that a faster test shows on fixtures and one end-to-end run
    already shows per change (README, "CI": `ci/nightly.sh tests`)."""
    nightly, selected, deselected = config.getoption("--nightly"), [], []
    for item in items:
        (selected if (item.get_closest_marker(NIGHTLY) is not None) == nightly else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def pytest_configure(config):
    from mla_fuse_conformance.settings import profiles

    config.addinivalue_line("markers", f"{NIGHTLY}: run by the nightly job (`pytest --nightly`), not per change")

    profiles.select_default(explicit=config.getoption("hypothesis_profile", None) is not None)
    if hasattr(config, "workerinput"):
        config.stash[_ROWS] = pathlib.Path(config.workerinput[_WORKER_KEY])
    else:
        reports = pathlib.Path(".mla_fuse_reports").absolute()
        config.stash[_ROWS] = reports / f"mutants-{uuid.uuid4().hex[:12]}.jsonl"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker appends to the controller's file."""
    node.workerinput[_WORKER_KEY] = str(node.config.stash[_ROWS])


@pytest.fixture
def mutant_results(request):
    """``append(row)``: one row of the mutation self-test's table."""
    path = request.config.stash[_ROWS]

    def append(row: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as stream:
            stream.write(json.dumps(row, sort_keys=True) + "\n")

    return append


def mutant_table(rows: list[dict]) -> list[str]:
    lines = [f"{'mutant':38} {'result':9} {'seconds':>8} {'examples':>8}  caught by"]
    for row in sorted(rows, key=lambda r: r["mutant"]):
        lines.append(f"{row['mutant']:38} {row['result']:9} {row['seconds']:8.2f} {row['examples']:8d}  "
                     f"{row.get('property') or '-'}")
    return lines


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):
        return
    path = config.stash[_ROWS]
    if not path.exists():
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.unlink()
    if rows:
        terminalreporter.write_sep("-", "mla_fuse mutation self-test")
        for line in mutant_table(rows):
            terminalreporter.write_line(line)


@pytest.fixture
def verify_one_deployment(tmp_path):
    """``run(impl, selection=..., **env) -> (exit status, report.json)``: ``mla-fuse verify --impl IMPL`` from
    an empty directory on the deployment properties of one model (``selection``, a ``-k``; default Llama 3.1 8B:
    its flash and rope calls), the dev profile, no map: the suite's own run of a third-party adapter, in seconds
    (issue 30's short run on every change; the whole ci profile is the nightly job's, ci/adapters_report.sh)."""
    import os
    import subprocess
    import sys

    def run(impl: str, selection: str = "in_deployment and llama-3.1-8b", **env: str) -> tuple[int, dict]:
        child = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
        child.pop("GITHUB_STEP_SUMMARY", None)
        result = subprocess.run(
            [sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", impl, "--profile", "dev", "-n", "0",
             "--map-seconds", "0", "--report-dir", str(tmp_path / "reports"), "--", "-k", selection],
            capture_output=True, text=True, cwd=tmp_path, env={**child, **env}, timeout=600)
        assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-2000:]
        return result.returncode, json.loads((tmp_path / "reports" / "report.json").read_text())

    return run


@pytest.fixture
def no_kernel_paths(monkeypatch):
    """A test of the printed lines, where the shell exports none of the ``MLA_FUSE_<PROJECT>_PATH`` variables
    (a developer's shell may: every one the run has is set in the lines, ``options.replay_environment``)."""
    import os

    from mla_fuse_conformance.declarations.options import kernel_paths

    for name in kernel_paths(os.environ):
        monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def third_party_root(tmp_path_factory):
    """``find(module, path_env, wheel_env, project, requirement, only=())``: the directory ``$path_env`` is to
    name for a third party's adapter (None: the installed package): ``$path_env`` itself, else the installed
    package, else the wheel ``$wheel_env`` names, unzipped here (only the members starting with one of
    ``only``, when given: LMDeploy's wheel unpacks to 370 MB, its adapter reads three files). Neither:
    skipped, and failed under CI=true (.ci/run downloads each wheel)."""
    import importlib.util
    import os
    import zipfile

    def find(module: str, path_env: str, wheel_env: str, project: str, requirement: str,
             only: tuple[str, ...] = ()) -> str | None:
        if os.environ.get(path_env):
            return os.environ[path_env]
        if importlib.util.find_spec(module) is not None:
            return None
        wheel = os.environ.get(wheel_env)
        if not wheel:
            if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
                pytest.fail(f"{project} not found: .ci/run downloads the wheel and sets {wheel_env}")
            pytest.skip(f"{project} not found: set {path_env} to an unpacked {requirement.partition('==')[0]} wheel, "
                        f"or {wheel_env} to the wheel file (pip download --no-deps {requirement}), or install it")
        root = tmp_path_factory.mktemp(module)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(root, [name for name in archive.namelist() if name.startswith(only)] if only else None)
        return str(root)

    return find
