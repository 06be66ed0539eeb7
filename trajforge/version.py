"""The version --version prints and the dataset card records: the installed distribution's, and the
git commit when the code runs from a checkout (a wheel has no .git beside it)."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout, when running from one


def project_version() -> str:
    try:
        return metadata.version("batch-runner")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_commit() -> str | None:
    """The checkout's commit (with -dirty for uncommitted changes), when the code runs from a git checkout."""
    if not (ROOT / ".git").exists():  # a directory in a clone, a file in a worktree
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def version() -> str:
    """`0.1.0 (git abcdef012345)`, or the number alone outside a checkout."""
    commit = git_commit()
    return f"{project_version()} (git {commit})" if commit else project_version()
