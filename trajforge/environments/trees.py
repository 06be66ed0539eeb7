"""A folder removed whatever a sample left in it. shutil.rmtree (Python 3.11) recurses once per level of
folders and holds a descriptor per level: a tree a thousand folders deep (`mkdir d && cd d` in a loop) raised
RecursionError through its ignore_errors, or met the descriptor limit (EMFILE, which ignore_errors hides)
and stayed, so the sample failed as a crash that --resume runs again, or its disk stayed mounted with its
data, or its workspace in /tmp, until the run's end. What rmtree leaves is removed by `rm -rf` (which walks
with fts: no depth limit, a bounded number of descriptors). And what lies under a folder, walked without
recursion (os.walk recurses once per level too)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

DEEP_TIMEOUT = 300.0  # seconds for `rm -rf` on a tree rmtree could not remove


def remove_tree(path: str) -> None:
    """`path` and all below it gone, as far as the runner may remove them; never raises."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        argv = ["rm", "-rf", "--one-file-system", "--", path]  # a file system mounted below stays (rmtree goes in)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=DEEP_TIMEOUT)


def below(folder: str) -> Iterator[os.DirEntry]:
    """Every entry under `folder`, in name order within a folder; no symlink followed. Walked with a stack of its
    own, as deep as paths go: os.walk recurses once per folder level (Python 3.11), a RecursionError ~1,000 deep.
    A folder is listed only after its own entry was yielded. OSError when one cannot be listed."""
    folders = [folder]
    while folders:
        with os.scandir(folders.pop()) as listed:
            entries = sorted(listed, key=lambda entry: entry.name)
        for entry in entries:
            yield entry
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.path)
