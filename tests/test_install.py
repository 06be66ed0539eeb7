"""The project as users get it: a wheel built from the checkout and installed (not editable) into a fresh
virtual environment, whose `batch-runner` command then works from any folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import ROOT, write_dataset
from conftest import source as source_of

TOP_LEVEL = {"batch_runner", "toolset_distributions", "trajectory", "trajforge"}
NOT_SOURCE = (".git", ".venv", "__pycache__", "*.egg-info", "build", "data", "tests", "bench", ".*cache")


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
    # ... and a fresh venv installs it, taking its dependencies from the machine.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [python, "-m", "pip", "--disable-pip-version-check", "install", "--no-deps", "--no-compile", wheel],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (record,) = [p / "RECORD" for p in site.glob("*.dist-info")]  # ours alone: the venv has no pip of its own
    recorded = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines()}
    assert {name.removesuffix(".py") for name in recorded if not name.endswith(".dist-info")} - {".."} == TOP_LEVEL
    at_root = {p.name.removesuffix(".py") for p in site.iterdir() if not p.name.endswith(".dist-info")}
    assert at_root == TOP_LEVEL

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY") and k != "PYTHONPATH"}
    imports = "import json, batch_runner, trajforge; print(json.dumps([batch_runner.__file__, trajforge.__file__]))"
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
