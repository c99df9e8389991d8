"""The nightly campaign workflow parses, runs on the GPU runners against the shared database,
calls a script that exists and parses, and that script's mla-fuse commands are valid commands."""

import argparse
import pathlib
import re
import shlex
import subprocess
import sys

import yaml

from mla_fuse_conformance.commands import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
SCRIPT = ROOT / "ci" / "nightly.sh"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps(job: str) -> list[dict]:
    return workflow()["jobs"][job]["steps"]


def test_scheduled_on_a_matrix_of_gpu_runners_sharing_one_database():
    document = workflow()
    triggers = document[True]  # YAML 1.1 reads the key `on` as True
    assert triggers["schedule"][0]["cron"] and "workflow_dispatch" in triggers
    campaign = document["jobs"]["campaign"]
    assert campaign["runs-on"] == ["self-hosted", "gpu"]
    assert len(campaign["strategy"]["matrix"]["runner"]) >= 2 and campaign["strategy"]["fail-fast"] is False
    assert re.fullmatch(r"\$\{\{ secrets\.\w+ \}\}", document["env"]["MLA_FUSE_HYPOTHESIS_DB"])
    assert document["jobs"]["export"]["needs"] == "campaign" and document["jobs"]["export"]["if"] == "always()"


def test_each_runner_uploads_its_summary_and_replay_files_whatever_happened():
    upload = next(step for step in steps("campaign") if step.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    assert set(upload["with"]["path"].split()) == {"reports/fuzz", ".mla_fuse_failures"}


def test_the_steps_call_the_nightly_script_which_parses():
    commands = [step["run"] for job in ("campaign", "export") for step in steps(job) if "run" in step]
    assert commands == ["bash ci/nightly.sh campaign", "bash ci/nightly.sh export"]
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def mla_fuse_commands() -> list[list[str]]:
    """The script's ``mla-fuse ...`` lines (continuations joined), variables given sample values."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    sample = {"MLA_FUSE_HYPOTHESIS_DB": "redis://127.0.0.1:6379/0", "CAMPAIGN_IMPL:-triton": "triton",
              "CAMPAIGN_MINUTES:-240": "240"}
    lines = [line.strip().rstrip(";").strip() for line in text.splitlines() if line.strip().startswith("mla-fuse ")]
    for name, value in sample.items():
        lines = [line.replace("${" + name + "}", value).replace("$" + name, value) for line in lines]
    return [shlex.split(line)[1:] for line in lines]


def test_the_script_runs_a_campaign_and_an_export_that_mla_fuse_accepts():
    parser = argparse.ArgumentParser(prog="mla-fuse")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in cli.COMMANDS:
        add(commands)
    parsed = [parser.parse_args(arguments) for arguments in mla_fuse_commands()]
    assert [args.command for args in parsed] == ["fuzz", "db"]
    campaign, export = parsed
    assert (campaign.db, campaign.minutes, campaign.out) == ("redis://127.0.0.1:6379/0", 240.0,
                                                             pathlib.Path("reports/fuzz"))
    assert (export.action, export.db) == ("export", "redis://127.0.0.1:6379/0")


def test_the_torch_legs_run_nightly_on_a_cpu_runner_with_the_ci_sizes():
    """The engine leg (torch 2.14.1 + triton 3.8.0), the torch floor (2.11.0 + 3.6.0) and the newest
    torch (2.15.0 + 3.9.0), docs/VERSIONS.md: several GB of CUDA wheels each, so nightly; the
    interpreter needs no GPU, and the campaign's large sizes and shared database are not for them."""
    job = workflow()["jobs"]["torch-legs"]
    assert "gpu" not in job["runs-on"]
    assert job["env"]["MLA_FUSE_PROPERTY_SIZES"] == "small" and job["env"]["MLA_FUSE_HYPOTHESIS_DB"] == ""
    assert job["strategy"]["fail-fast"] is False
    assert job["strategy"]["matrix"]["leg"] == ["engine-torch", "floor-torch", "newest-torch"]
    assert [step["run"] for step in job["steps"] if "run" in step] == ["bash ci/nightly.sh ${{ matrix.leg }}"]
    nightly = SCRIPT.read_text()
    assert "engine-torch) exec bash ci/version_leg.sh engine" in nightly
    assert "floor-torch | newest-torch) exec bash ci/version_leg.sh \"$1\"" in nightly
    script = (ROOT / "ci" / "version_leg.sh").read_text()
    for leg, pins in (("engine", r"torch==2\.14\.1 triton==3\.8\.0"), ("floor-torch", r"torch==2\.11\.0 triton==3\.6\.0"),
                      ("newest-torch", r"torch==2\.15\.0 triton==3\.9\.0")):
        assert re.search(leg + r"\)\s*\n\s*pins=\(" + pins + r"\)\s*\n\s*unit_tests=\([^)]*\"\$\{PASS_TESTS\[@\]\}\"\)", script), leg
    subprocess.run(["bash", "-n", str(ROOT / "ci" / "version_leg.sh")], check=True)


ADAPTERS = ["vllm-triton", "flaggems", "liger", "flash-attn-rotary", "sglang-triton", "lmdeploy"]
ADAPTERS_SCRIPT = ROOT / "ci" / "adapters_report.sh"


def test_the_third_party_adapters_run_nightly_each_on_a_cpu_runner_of_its_own():
    """The whole ci profile of each third-party adapter (docs/THIRD_PARTY.md) under the interpreter, a matrix
    entry each, its report uploaded whatever happened."""
    from mla_fuse_conformance.contract.implementation import registered_names

    job = workflow()["jobs"]["adapters"]
    assert "gpu" not in job["runs-on"] and job["strategy"]["fail-fast"] is False
    assert job["env"]["MLA_FUSE_PROPERTY_SIZES"] == "small" and job["env"]["MLA_FUSE_HYPOTHESIS_DB"] == ""
    assert job["strategy"]["matrix"]["adapter"] == ADAPTERS and set(ADAPTERS) <= set(registered_names())
    commands = [step["run"] for step in job["steps"] if "run" in step]
    assert commands == ["bash ci/nightly.sh adapters ${{ matrix.adapter }}"]
    upload = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "reports/adapters/${{ matrix.adapter }}"
    assert 'adapters) shift; exec bash ci/adapters_report.sh "$@" ;;' in SCRIPT.read_text()
    subprocess.run(["bash", "-n", str(ADAPTERS_SCRIPT)], check=True)


def test_the_adapters_verify_command_is_one_mla_fuse_accepts():
    parser = argparse.ArgumentParser(prog="mla-fuse")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in cli.COMMANDS:
        add(commands)
    text = ADAPTERS_SCRIPT.read_text().replace("\\\n", " ")
    [line] = [line.split("mla-fuse ", 1)[1].split(">", 1)[0] for line in text.splitlines()
              if " mla-fuse verify --impl " in line and not line.lstrip().startswith(("#", "echo"))]
    for name, value in {'"$impl"': "liger", '"${MLA_FUSE_ADAPTERS_PROFILE:-ci}"': "ci",
                        '"$out"': "reports/adapters/liger",
                        '"$out/known-failures.txt"': "reports/adapters/liger/known-failures.txt",
                        '"${extra[@]}"': "-n 1 -- -k deployment"}.items():
        assert name in line, name
        line = line.replace(name, value)
    args = parser.parse_args(shlex.split(line))
    assert (args.command, args.impl, args.profile, args.report_dir, args.workers, args.pytest_args) == (
        "verify", "liger", "ci", pathlib.Path("reports/adapters/liger"), "1", ["-k", "deployment"])
    assert args.write_known_failures == pathlib.Path("reports/adapters/liger/known-failures.txt")


FAKE_MLA_FUSE = """#!/usr/bin/env bash
echo "$(printf "%q " "$@")| ${MLA_FUSE_FLAGGEMS_PATH:-} | ${MLA_FUSE_LIGER_PATH:-} | ${MLA_FUSE_FLASH_ATTN_PATH:-} \
| ${MLA_FUSE_SGLANG_PATH:-} | ${MLA_FUSE_LMDEPLOY_PATH:-} | $MLA_FUSE_FAILURE_DIR" >> "$CALLS"
echo "verdict: from $3"
exit $(cat "$EXITS/$3")
"""


def fake_wheel(path: pathlib.Path, package: str) -> pathlib.Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{package}/__init__.py", "")
    return path


def fake_sdist(path: pathlib.Path, top: str, package: str) -> pathlib.Path:
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as sdist:
        sdist.addfile(tarfile.TarInfo(f"{top}/{package}/__init__.py"), io.BytesIO(b""))
    return path


def test_the_adapters_script_fails_only_when_a_verify_could_not_run(tmp_path):
    """The script run (copied into an empty tree) with a fake ``mla-fuse``: each adapter once, FlagGems from a
    wheel it unpacks, Liger from a directory given, flash-attn from an sdist it unpacks, SGLang and LMDeploy from a
    wheel, the extra arguments appended; verify's exit 1 (a
    failing kernel) leaves the script's status 0, exit 2 (could not run) makes it 1."""
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "adapters_report.sh").write_text(ADAPTERS_SCRIPT.read_text())
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mla-fuse").write_text(FAKE_MLA_FUSE)
    (tmp_path / "bin" / "mla-fuse").chmod(0o755)
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)  # the script unzips with python3 -m zipfile
    exits = tmp_path / "exits"
    exits.mkdir()
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls"), "EXITS": str(exits),
           "MLA_FUSE_INSTALLED": "1", "MLA_FUSE_FLAGGEMS_WHEEL": str(fake_wheel(tmp_path / "fg.whl", "flag_gems")),
           "MLA_FUSE_LIGER_PATH": "/opt/liger",
           "MLA_FUSE_FLASH_ATTN_SDIST": str(fake_sdist(tmp_path / "fa.tar.gz", "flash_attn-2.8.3.post2", "flash_attn")),
           "MLA_FUSE_SGLANG_WHEEL": str(fake_wheel(tmp_path / "sglang.whl", "sglang")),
           "MLA_FUSE_LMDEPLOY_WHEEL": str(fake_wheel(tmp_path / "lmdeploy.whl", "lmdeploy")),
           "MLA_FUSE_VERIFY_ARGS": "-n 1 -- -k 'in_deployment and llama'"}
    for codes, expected in (((0, 1, 1, 1, 1, 1), 0), ((1, 2, 0, 0, 0, 0), 1), ((0, 0, 0, 0, 0, 2), 1)):
        for impl, code in zip(ADAPTERS, codes):
            (exits / impl).write_text(str(code))
        (tmp_path / "calls").unlink(missing_ok=True)
        result = subprocess.run(["bash", str(tmp_path / "ci" / "adapters_report.sh")], env=env, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == expected, result.stdout + result.stderr
        calls = [line.split(" | ") for line in (tmp_path / "calls").read_text().splitlines()]
        assert [shlex.split(call[0])[:2] for call in calls] == [["verify", "--impl"]] * len(ADAPTERS)
        assert [shlex.split(call[0])[2] for call in calls] == ADAPTERS
        assert all(shlex.split(call[0])[-5:] == ["-n", "1", "--", "-k", "in_deployment and llama"] for call in calls)
        assert calls[1][1] == "reports/adapters/packages/flag-gems" and calls[2][2] == "/opt/liger"
        assert (tmp_path / calls[1][1] / "flag_gems" / "__init__.py").is_file()
        assert calls[3][3] == "reports/adapters/packages/flash-attn/flash_attn-2.8.3.post2"
        assert (tmp_path / calls[3][3] / "flash_attn" / "__init__.py").is_file()
        assert calls[4][4] == "reports/adapters/packages/sglang" and (tmp_path / calls[4][4] / "sglang").is_dir()
        assert calls[5][5] == "reports/adapters/packages/lmdeploy" and (tmp_path / calls[5][5] / "lmdeploy").is_dir()
        assert [call[6] for call in calls] == [f"reports/adapters/{impl}/failures" for impl in ADAPTERS]
        for impl, code in zip(ADAPTERS, codes):
            assert f"{impl}: mla-fuse verify exit status {code} " in result.stdout, result.stdout
            assert (tmp_path / "reports" / "adapters" / impl / "verify.log").read_text().startswith("verdict: from")


def test_the_tests_marked_nightly_run_nightly_and_only_there():
    """``pytest`` (the test command) deselects the tests marked nightly; ``--nightly`` selects them alone, and
    the nightly job runs them installed as .ci/run installs the test command."""
    job = workflow()["jobs"]["tests"]
    assert "gpu" not in job["runs-on"] and job["env"]["MLA_FUSE_HYPOTHESIS_DB"] == ""
    assert [step["run"] for step in job["steps"] if "run" in step] == ["bash ci/nightly.sh tests"]
    branch = SCRIPT.read_text().replace("\\\n", " ").partition("    tests)\n")[2].partition(";;")[0]
    assert branch.rstrip().endswith("exec env CI=true python -m pytest -n auto --nightly"), branch
    # the install of the test command (.ci/run's last line, the README's), step for step
    test_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    install = test_command.removesuffix(" && pytest -n auto")
    steps = [line.strip() for line in branch.splitlines()
             if line.strip() and not line.strip().startswith(("bash ci/install_redis.sh", ". ci/third_party_wheels.sh",
                                                              "exec "))]
    assert install != test_command and " && ".join(steps) == install, (steps, install)
    # the Redis demonstration is nightly, and fails under CI=true without its server
    assert "bash ci/install_redis.sh" in branch and "install_redis" not in (ROOT / ".ci" / "run").read_text()
    # the third parties' files, for the adapters' nightly reproducer tests (CI=true fails them without)
    assert ". ci/third_party_wheels.sh" in branch and ". ci/third_party_wheels.sh" in (ROOT / ".ci" / "run").read_text()

    def collected(*options):
        listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                 "tests/test_baseline.py", *options], cwd=ROOT, capture_output=True, text=True,
                                timeout=300)
        return [line for line in listed.stdout.splitlines() if "::" in line]

    marked = [name for name in collected("--nightly")]
    assert marked and all("vllms_own_report" in name for name in marked), marked
    per_change = collected()
    assert per_change and not set(marked) & set(per_change), per_change


FAKE_VERIFY = """#!/usr/bin/env bash
seed=${@: -1}; seed=${seed#--hypothesis-seed=}
echo "$(printf "%q " "$@")| ${CI:-unset} | $MLA_FUSE_HYPOTHESIS_DB" >> "$CALLS"
if [ "$seed" = 7 ]; then
  printf 'failures:\\n  test_mla:test_x: wrong result on dtype float32\\n      replay: mla-fuse repro F.json\\n\\nverdict: FAIL\\n'
  exit 1
fi
echo "verdict: PASS"
"""


def test_the_main_job_runs_the_readme_verify_once_per_seed_and_notes_each_failing_seed(tmp_path):
    """``ci/nightly.sh main-job``: the README's `mla-fuse verify` from a clone, once per seed, each with a
    database of its own and CI unset (a user's shell: the dev profile); a failing seed gets an issue-style
    note with its command and failures, and the job fails."""
    job = workflow()["jobs"]["main-job"]
    assert [step["run"] for step in job["steps"] if "run" in step] == ["bash ci/nightly.sh main-job"]
    assert 'main-job) shift; exec bash ci/main_job.sh "$@" ;;' in SCRIPT.read_text()
    fake = tmp_path / "bin" / "mla-fuse"
    fake.parent.mkdir()
    fake.write_text(FAKE_VERIFY)
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{fake.parent}:{pathlib.Path(sys.executable).parent}:/usr/bin:/bin", "CALLS": str(calls),
           "MLA_FUSE_INSTALLED": "1", "CI": "true", "HOME": str(tmp_path)}
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (clone / "ci" / "main_job.sh").write_text((ROOT / "ci" / "main_job.sh").read_text())  # the tree's own script
    failed = subprocess.run(["bash", "ci/main_job.sh", "3", "7"], cwd=clone, env=env, capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    lines = calls.read_text().splitlines()
    assert [line.split("|")[0].split()[-1] for line in lines] == ["--hypothesis-seed=3", "--hypothesis-seed=7"]
    assert all(line.split("|")[1].strip() == "unset" for line in lines)  # CI unset: the dev profile
    assert len({line.split("|")[2] for line in lines}) == 2  # a database per seed
    notes = (clone / "reports" / "main-job" / "notes.md").read_text()
    assert "with seed 7" in notes and "with seed 3" not in notes
    assert "--hypothesis-seed=7" in notes and "replay: mla-fuse repro F.json" in notes
    calls.unlink()
    passed = subprocess.run(["bash", "ci/main_job.sh", "3"], cwd=clone, env=env, capture_output=True, text=True)
    assert passed.returncode == 0 and "every seed passed: 3" in passed.stdout, passed.stdout + passed.stderr
