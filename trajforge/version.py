"""The version --version prints: the installed distribution's, and the git commit when the code runs
from a checkout (a wheel has no .git beside it)."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def version() -> str:
    try:
        number = importlib.metadata.version("batch-runner")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        number = "unknown"
    if not (ROOT / ".git").exists():  # a directory in a clone, a file in a worktree
        return number
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):  # no git here
        commit = ""
    return f"{number} (git {commit})" if commit else number
