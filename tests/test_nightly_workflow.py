"""The nightly campaign workflow parses, runs on the GPU runners against the shared database,
calls a script that exists and parses, and that script's mla-fuse commands are valid commands."""

import argparse
import pathlib
import re
import shlex
import subprocess

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
        assert re.search(leg + r"\)\s*\n\s*pins=\(" + pins + r"\)\s*\n\s*unit_tests=\(\"\$\{PASS_TESTS\[@\]\}\"\)", script), leg
    subprocess.run(["bash", "-n", str(ROOT / "ci" / "version_leg.sh")], check=True)
