"""A folder removed whatever a sample left in it. shutil.rmtree (Python 3.11) recurses once per level of
folders, and a tree a thousand folders deep (`mkdir d && cd d` in a loop) raised RecursionError through its
ignore_errors: the sample failed as a crash that --resume runs again, its disk stayed mounted with its data
until the run's end, and the run's leftovers were left in /tmp. Such a tree is removed by `rm -rf` (which
walks with fts: no depth limit)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess

DEEP_TIMEOUT = 300.0  # seconds for `rm -rf` on a tree too deep for rmtree


def remove_tree(path: str) -> None:
    """`path` and all below it gone, as far as the runner may remove them; never raises."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        argv = ["rm", "-rf", "--one-file-system", "--", path]  # a file system mounted below stays (rmtree goes in)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=DEEP_TIMEOUT)
