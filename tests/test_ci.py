"""The CI workflow is valid, calls scripts that exist and parse, and runs the commands the README documents."""

import pathlib
import re
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def run_commands() -> list[str]:
    return [step["run"] for job in workflow()["jobs"].values() for step in job["steps"] if "run" in step]


def test_jobs_and_triggers():
    jobs = workflow()["jobs"]
    assert set(jobs) == {"cpu", "changes", "gpu"}
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "gpu"]
    assert jobs["gpu"]["needs"] == "changes" and "kernels" in jobs["gpu"]["if"]
    kernel_paths = jobs["changes"]["steps"][1]["with"]["filters"]
    assert "mla_fuse/kernels/**" in kernel_paths and "mla_fuse/passes/**" in kernel_paths


def test_every_script_exists_parses_and_is_documented():
    readme = (ROOT / "README.md").read_text()
    for command in run_commands():
        script = re.fullmatch(r"bash (\S+)(?: \S+)*", command.strip()).group(1)
        assert (ROOT / script).is_file(), script
        subprocess.run(["bash", "-n", str(ROOT / script)], check=True)
        assert command.strip() in readme, f"README does not document {command.strip()!r}"


def test_ci_run_is_the_readme_test_command():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert command.endswith("pytest -n auto")
    assert f"```bash\n{command}\n```" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("artifact", [".hypothesis/mla_fuse", ".mla_fuse_failures", "reports"])
def test_cpu_job_uploads_database_failures_and_reports(artifact):
    upload = next(step for step in workflow()["jobs"]["cpu"]["steps"] if step.get("uses", "").startswith(
        "actions/upload-artifact"))
    assert artifact in upload["with"]["path"].split()
