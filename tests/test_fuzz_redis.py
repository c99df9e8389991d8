"""Two fuzzing campaigns share a failure through a real Redis server (docs/FUZZING.md).

The demonstration, as a test: a Redis server (Debian's ``redis-server``, started here on a free
loopback port, stopped at the end) holds the example database of two ``mla-fuse fuzz``
campaigns run one after the other as separate processes in separate directories, as on two
hosts, against the planted bug ``mutant:fp8_kv_scales_swapped`` (K and V fp8 scales swapped: the
suite's explicit examples do not catch it, HypoFuzz finds it by search within a few dozen
inputs). Then:

* host A finds the failure, stores it in Redis and writes a replay file;
* host B's very first input fails, and B stores no failing input that A had not stored: it
  replayed A's failure before generating anything;
* a developer's plain ``pytest --pyargs mla_fuse_conformance`` run pointed at the same Redis
  (profile ``mla_fuse.replay``: stored examples only) fails with the same case, from a third
  directory, and ``mla-fuse repro`` replays A's file without hypothesis;
* ``mla-fuse db export`` carries the stored failure into one file that imports into a directory.

Nightly (``pytest --nightly``; ``ci/nightly.sh tests`` installs the server with
``ci/install_redis.sh``): per change, tests/test_fuzz.py runs a real two-worker campaign and checks
the shared database's parts on fixtures (a ``redis://`` URL opening hypothesis' Redis database, the
read-only runner, the replay profile, export and import). Without the server the test fails under
``CI=true`` and is skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.nightly

MUTANT = "mutant:fp8_kv_scales_swapped"
PROPERTY = "test_fused_flash_matches_reference"
NODEID = f"test_flash.py::{PROPERTY}"
CAMPAIGN_TIMEOUT = 300  # seconds; each campaign stops itself once the property has failed (~30-60 s)
COMMAND_TIMEOUT = 180


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_redis(url: str, server: subprocess.Popen, seconds: float = 15.0) -> bool:
    from redis import Redis
    from redis.exceptions import RedisError

    client = Redis.from_url(url)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and server.poll() is None:
        try:
            return bool(client.ping())
        except RedisError:
            time.sleep(0.1)
    return False


@pytest.fixture
def redis_url(tmp_path):
    """A real redis-server on a free loopback port, with no persistence; stopped afterwards."""
    executable = shutil.which("redis-server")
    if executable is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("redis-server is not installed: CI installs it with ci/install_redis.sh")
        pytest.skip("redis-server is not installed (bash ci/install_redis.sh); CI runs this test")
    for _attempt in range(3):  # another process may take the port between probe and bind
        port = free_loopback_port()
        url = f"redis://127.0.0.1:{port}/0"
        server = subprocess.Popen([executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", str(tmp_path)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if wait_for_redis(url, server):
                yield url
                return
        finally:
            server.terminate()
            server.wait(timeout=30)
    pytest.fail("could not start redis-server on a free loopback port")


def host_environment() -> dict[str, str]:
    """This environment without pytest's and the suite's variables (an xdist worker id, CI's
    PYTEST_ADDOPTS junit path, a database or failure directory): each "host" starts clean."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith(("PYTEST_", "MLA_FUSE_"))}


def run(command: list[str], cwd, timeout: int, **env) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(command, cwd=cwd, env={**host_environment(), **env}, capture_output=True, text=True,
                          timeout=timeout)


def mla_fuse(*args: str, cwd, timeout: int = COMMAND_TIMEOUT, **env) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "mla_fuse_conformance", *args], cwd, timeout, **env)


def campaign(host, redis_url: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = mla_fuse("fuzz", f"--impl={MUTANT}", "--workers", "1", "--db", redis_url, "--minutes", "4",
                      "--", "-k", PROPERTY, cwd=host, timeout=CAMPAIGN_TIMEOUT)
    summary_path = host / ".mla_fuse_reports" / "fuzz" / "summary.json"
    assert summary_path.exists(), result.stdout + result.stderr
    return result, json.loads(summary_path.read_text())


def failure_entries(redis_url: str, database_key: str) -> tuple[set[bytes], set[bytes]]:
    """The choice sequences stored under a property's failure keys: (shrunk, not yet shrunk)."""
    from redis import Redis

    from mla_fuse_conformance.settings.database import REDIS_KEY_PREFIX

    client, key = Redis.from_url(redis_url), REDIS_KEY_PREFIX + bytes.fromhex(database_key)
    return client.smembers(key), client.smembers(key + b".secondary")


def replayed_case(path: str) -> dict:
    return json.loads(open(path).read())["case"]


def test_a_failure_found_on_one_host_is_replayed_by_another_and_by_plain_pytest(redis_url, tmp_path):
    # host A: HypoFuzz finds the planted bug by search and stores it in Redis
    result_a, summary_a = campaign(tmp_path / "host_a", redis_url)
    found = summary_a["properties"][NODEID]
    assert result_a.returncode == 1 and found["verdict"] == "FAIL", result_a.stdout
    assert found["replay"] == "failed" and len(found["replay_files"]) == 1, result_a.stdout
    assert len(found["first_failure_at"]) == 1, found
    shrunk_a, unshrunk_a = failure_entries(redis_url, found["database_key"])
    assert shrunk_a, "host A stored no shrunk failure in Redis"

    # host B: its first input fails, and it stores no failing input A had not stored
    result_b, summary_b = campaign(tmp_path / "host_b", redis_url)
    replayed = summary_b["properties"][NODEID]
    assert result_b.returncode == 1 and replayed["first_failure_at"] == [1], result_b.stdout
    shrunk_b, unshrunk_b = failure_entries(redis_url, replayed["database_key"])
    assert unshrunk_b <= shrunk_a | unshrunk_a, "host B found a failing input of its own instead of replaying A's"
    case = replayed_case(found["replay_files"][0])
    assert replayed_case(replayed["replay_files"][0]) == case

    # a developer: plain pytest from another directory, reading the same Redis, generating nothing
    developer = tmp_path / "developer"
    plain = run([sys.executable, "-m", "pytest", "--pyargs", "mla_fuse_conformance", f"--mla-fuse-impl={MUTANT}", "-k", PROPERTY,
                 "--hypothesis-profile=mla_fuse.replay", "-p", "no:cacheprovider"],
                developer, COMMAND_TIMEOUT, MLA_FUSE_HYPOTHESIS_DB=redis_url)
    assert plain.returncode == 1 and "1 failed" in plain.stdout, plain.stdout[-3000:]
    written = list((developer / ".mla_fuse_failures").glob("*.json"))
    assert [replayed_case(str(path)) for path in written] == [case]

    # and without hypothesis, from A's replay file
    repro = mla_fuse("repro", found["replay_files"][0], cwd=developer)
    assert repro.returncode == 1 and "REPRODUCED" in repro.stdout, repro.stdout + repro.stderr

    # the export carries the stored failure as one file
    export = tmp_path / "campaign.zip"
    assert mla_fuse("db", "export", str(export), "--db", redis_url, cwd=developer).returncode == 0
    copy = tmp_path / "imported"
    assert mla_fuse("db", "import", str(export), "--db", str(copy), cwd=developer).returncode == 0
    from hypothesis.database import DirectoryBasedExampleDatabase

    assert set(DirectoryBasedExampleDatabase(copy).fetch(bytes.fromhex(found["database_key"]))) == shrunk_b
