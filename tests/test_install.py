"""The project as users get it: a wheel built from the checkout and installed (not editable), with its
dependencies, into a fresh virtual environment that sees nothing of this Python's packages, whose
`batch-runner` command then works from any folder.

The dependencies come from a wheelhouse that pip fills from the package index the first time (about a
minute, 130 MB) and that later runs, of any clone, reuse offline: ~/.cache/batch-runner/wheelhouse (under
$XDG_CACHE_HOME when set), beside pip's own cache.
The install itself always resolves the wheel's declared dependencies against it (`--no-index`), so a
dependency the wheel forgets to declare fails here, as it would on a fresh machine; one added to
pyproject that the wheelhouse lacks is downloaded first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, write_dataset
from conftest import source as source_of

TOP_LEVEL = {"batch_runner", "toolset_distributions", "trajectory", "trajforge"}
NOT_SOURCE = (".git", ".venv", "__pycache__", "*.egg-info", "build", "data", "tests", "bench", ".*cache")


def wheelhouse() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "batch-runner" / "wheelhouse"


def install(pip: list, venv: Path, wheel: Path, wheels: Path) -> subprocess.CompletedProcess:
    """Install `wheel` with its dependencies into `venv` from `wheels`, filling it from the index when
    it lacks one. This environment's pip installs: the venv has none of its own."""
    into = [*pip, "--python", venv / "bin" / "python", "install", "--no-compile", "--no-index", "--find-links", wheels]
    installed = subprocess.run([*into, wheel], capture_output=True, text=True)
    if installed.returncode == 0:
        return installed
    for ours in wheels.glob("batch_runner-*.whl"):  # an earlier build's copy: pip would read its dependencies
        ours.unlink()
    fetched = subprocess.run([*pip, "download", "-d", wheels, wheel], capture_output=True, text=True)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    return subprocess.run([*into, wheel], capture_output=True, text=True)


def test_the_installed_wheel_holds_three_modules_and_one_package_and_its_command_runs(tmp_path):
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    # This environment builds the wheel (no build isolation: nothing is downloaded) ...
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "wheels", source],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheels").glob("batch_runner-*.whl")
    # ... and a fresh venv, without this Python's packages, installs it with its dependencies.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    installed = install(pip, venv, wheel, wheelhouse())
    assert installed.returncode == 0, installed.stdout + installed.stderr

    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (record,) = site.glob("batch_runner-*.dist-info/RECORD")
    recorded = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines()}
    assert {name.removesuffix(".py") for name in recorded if not name.endswith(".dist-info")} - {".."} == TOP_LEVEL

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY") and k != "PYTHONPATH"}
    modules = "batch_runner, trajforge, fire"  # ours and a dependency: all from the venv
    imports = f"import json, {modules}; print(json.dumps([m.__file__ for m in ({modules})]))"
    where = subprocess.run(
        [python, "-c", imports],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    assert all(path.startswith(f"{venv}/") for path in json.loads(where.stdout)), where.stdout

    dataset = write_dataset(tmp_path / "prompts.jsonl", [{"prompt": "say hi"}, {"prompt": "list files"}])
    command = [venv / "bin" / "batch-runner", f"--dataset_file={dataset}", "--batch_size=2", "--run_name=installed"]
    result = subprocess.run(
        [*command, "--model=mock", "--distribution=terminal_only", "--num_workers=1"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    written = (elsewhere / "data" / "installed" / "trajectories.jsonl").read_text().splitlines()
    assert sorted(source_of(json.loads(line))["prompt"] for line in written) == ["list files", "say hi"]
    shown = subprocess.run(
        [venv / "bin" / "batch-runner", "--help"], capture_output=True, text=True, cwd=elsewhere, env=env
    )
    assert shown.returncode == 0 and "usage: batch-runner --dataset_file=FILE" in shown.stdout, (
        shown.stdout + shown.stderr
    )
