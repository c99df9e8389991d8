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


def ci_run_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def test_ci_run_checks_the_engine_pins_and_the_oldest_releases_before_the_tests():
    lines = ci_run_lines()
    for command in ("bash ci/engine_pins.sh", "bash ci/version_leg.sh oldest"):
        assert any(line.startswith(command) for line in lines[:-1]), \
            f".ci/run does not run {command!r} before the test command"
        subprocess.run(["bash", "-n", str(ROOT / command.split()[1])], check=True)


def floors() -> dict[str, str]:
    """``name -> floor`` of pyproject.toml's ``name>=X`` requirements (dependencies and extras)."""
    return dict(re.findall(r'"([a-z][a-z0-9_-]*)>=([0-9.]+)', (ROOT / "pyproject.toml").read_text()))


@pytest.mark.parametrize("leg, names", [
    ("oldest", ("triton", "hypothesis")),   # every change, on the torch 2.13 CPU build (no triton requirement)
    ("floor-torch", ("torch", "triton")),   # nightly: the floor's CUDA torch is several GB (docs/VERSIONS.md)
])
def test_the_oldest_legs_install_the_floors_of_pyproject(leg, names):
    script = (ROOT / "ci" / "version_leg.sh").read_text()
    oldest = re.search(leg + r"\)\s*\n\s*pins=\(([^)]*)\)", script).group(1).split()
    pins = dict(pin.split("==") for pin in oldest)
    for name in names:
        pin, floor = ([int(part) for part in version.split(".")] for version in (pins[name], floors()[name]))
        assert pin == floor + [0] * (len(pin) - len(floor)), f"the {leg} leg runs {name} {pins[name]}, " \
                                                           f"the floor is {floors()[name]}"


def test_the_versions_doc_names_every_engine_pin_the_script_checks():
    script = (ROOT / "ci" / "engine_pins.sh").read_text()
    pin_sets = re.search(r"PIN_SETS=\((.*?)\n\)", script, re.S).group(1)
    versions = (ROOT / "docs" / "VERSIONS.md").read_text()
    for pin in re.findall(r"[a-z][a-z0-9_-]*==[0-9.]+", pin_sets):
        assert f"`{pin}`" in versions or pin.split("==")[1] in versions, f"docs/VERSIONS.md does not name {pin}"


def test_pyproject_installs_every_package_of_the_tree():
    """A subpackage missing from ``[tool.setuptools] packages`` is absent from a non-editable install."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'"(mla_fuse(?:_conformance|_reference)?(?:\.[a-z_]+)*)"', text.split("packages = [", 1)[1]
                            .split("]", 1)[0]))
    roots = {"mla_fuse": ROOT / "mla_fuse", "mla_fuse_conformance": ROOT / "property_tests",
             "mla_fuse_reference": ROOT / "reference"}
    found = {name + "".join("." + part for part in init.parent.relative_to(root).parts)
             for name, root in roots.items() for init in root.rglob("__init__.py")}
    assert found == listed, f"not in pyproject.toml packages: {sorted(found - listed)}; absent: {sorted(listed - found)}"
