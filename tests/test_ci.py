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


FAKE_MLA_FUSE = """#!/usr/bin/env bash
case $3 in
  flaggems) package=$MLA_FUSE_FLAGGEMS_PATH ;; liger) package=$MLA_FUSE_LIGER_PATH ;;
  sglang-triton) package=$MLA_FUSE_SGLANG_PATH ;; flash-attn-rotary) package=$MLA_FUSE_FLASH_ATTN_PATH ;;
  lmdeploy) package=$MLA_FUSE_LMDEPLOY_PATH ;;
esac
echo "$(printf '%q ' "$@")| $(ls "${package:-/nowhere}" | tr '\\n' ' ')| $MLA_FUSE_FAILURE_DIR" >> "$CALLS"
echo "verdict: FAIL"
exit $(cat "$EXITS/$3")
"""
PEERS = ("flaggems", "liger", "sglang-triton", "flash-attn-rotary", "lmdeploy")


def peers_tree(tmp_path: pathlib.Path, packages: tuple[str, ...]) -> dict:
    """A copy of ci/gpu.sh in an empty tree, a fake ``mla-fuse`` recording its calls, wheels of ``packages``,
    flash-attn's sdist, and SGLang's kernel files unpacked in a directory its variable names."""
    import sys
    import tarfile
    import zipfile

    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "gpu.sh").write_text((ROOT / "ci" / "gpu.sh").read_text())
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mla-fuse").write_text(FAKE_MLA_FUSE)
    (tmp_path / "bin" / "mla-fuse").chmod(0o755)
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    (tmp_path / "wheels").mkdir()
    for package in packages:
        with zipfile.ZipFile(tmp_path / "wheels" / f"{package}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{package}/__init__.py", "")
            wheel.writestr(f"{package}-1.0.dist-info/METADATA", "Name: x\n")
    sdist = tmp_path / "sdist" / "flash_attn-1.0"
    (sdist / "flash_attn").mkdir(parents=True)
    (sdist / "flash_attn" / "__init__.py").write_text("")
    (sdist / "PKG-INFO").write_text("Name: flash-attn\n")
    with tarfile.open(tmp_path / "wheels" / "flash_attn-1.0.tar.gz", "w:gz") as archive:
        archive.add(sdist, arcname="flash_attn-1.0")
    for part in ("sglang/kernels", "sglang-1.0.dist-info"):  # SGLang's kernel files alone, as the GPU is given them
        (tmp_path / "sglang-kernels" / part).mkdir(parents=True)
    (tmp_path / "exits").mkdir()
    return {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls"),
            "EXITS": str(tmp_path / "exits"), "MLA_FUSE_SGLANG_PATH": str(tmp_path / "sglang-kernels"),
            "MLA_FUSE_INSTALLED": "1", "MLA_FUSE_WHEELS": str(tmp_path / "wheels"), "MLA_FUSE_GPU_STEPS": "peers",
            "MLA_FUSE_LIMIT_peers": "200", "TRITON_CACHE_DIR": str(tmp_path / "triton"), "HOME": str(tmp_path)}


def test_the_gpu_jobs_peers_step_verifies_the_five_peers_from_what_it_is_given(tmp_path):
    """ci/gpu.sh's ``peers`` step (no GPU needed to check its wiring: a fake ``mla-fuse``): each wheel of
    $MLA_FUSE_WHEELS and flash-attn's sdist unpacked and named by the adapter's variable, SGLang's kernel files
    where its variable names them, a verify each under a fifth of the step's limit; a failing kernel (exit 1)
    leaves the step ok, a verify that could not run (2) or a missing wheel fails it."""
    env = peers_tree(tmp_path, ("flag_gems", "liger_kernel", "lmdeploy"))
    listings = [["flag_gems", "flag_gems-1.0.dist-info"], ["liger_kernel", "liger_kernel-1.0.dist-info"],
                ["sglang", "sglang-1.0.dist-info"], ["PKG-INFO", "flash_attn"], ["lmdeploy", "lmdeploy-1.0.dist-info"]]
    found = ["flag_gems-1.0-py3-none-any.whl", "liger_kernel-1.0-py3-none-any.whl",
             f"MLA_FUSE_SGLANG_PATH={tmp_path / 'sglang-kernels'}", "flash_attn-1.0.tar.gz", "lmdeploy-1.0-py3-none-any.whl"]
    for codes, expected in (((1, 0, 1, 0, 1), 0), ((0, 2, 0, 0, 0), 1), ((0, 0, 0, 2, 0), 1), ((0, 0, 0, 0, 2), 1)):
        for impl, code in zip(PEERS, codes):
            (tmp_path / "exits" / impl).write_text(str(code))
        (tmp_path / "calls").unlink(missing_ok=True)
        result = subprocess.run(["bash", str(tmp_path / "ci" / "gpu.sh")], env=env, capture_output=True, text=True,
                                timeout=120)
        out = result.stdout + result.stderr
        assert result.returncode == expected, out
        calls = [line.split(" | ") for line in (tmp_path / "calls").read_text().splitlines()]
        assert [call[0].split()[:3] for call in calls] == [["verify", "--impl", impl] for impl in PEERS]
        assert all("--profile gpu --report-dir reports/gpu/peers/" in call[0] for call in calls), calls
        assert [call[1].split() for call in calls] == listings
        assert [call[2] for call in calls] == [f"reports/gpu/peers/{impl}/failures" for impl in PEERS]
        for impl, what, code in zip(PEERS, found, codes):
            assert f"{impl}, {what}: verify --profile gpu exit {code} " in out, out
        assert "past 25 s" in out, out  # a fifth of the step's 200 s, less 15
        assert ("peers     ok" if expected == 0 else "peers     FAILED (1)") in out, out
    (tmp_path / "wheels" / "liger_kernel-1.0-py3-none-any.whl").unlink()
    for impl in PEERS:
        (tmp_path / "exits" / impl).write_text("0")
    result = subprocess.run(["bash", str(tmp_path / "ci" / "gpu.sh")], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and f"liger: no liger_kernel wheel in {tmp_path / 'wheels'}" in result.stdout, \
        result.stdout + result.stderr
