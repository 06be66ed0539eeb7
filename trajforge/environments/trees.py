"""A folder removed whatever a sample left in it. shutil.rmtree (Python 3.11) recurses once per level of
folders and holds a descriptor per level: a tree a thousand folders deep (`mkdir d && cd d` in a loop) raised
RecursionError through its ignore_errors, or met the descriptor limit (EMFILE, which ignore_errors hides)
and stayed, so the sample failed as a crash that --resume runs again, or its disk stayed mounted with its
data, or its workspace in /tmp, until the run's end. What rmtree leaves is removed by `rm -rf` (which walks
with fts: no depth limit, a bounded number of descriptors). A runner that is not root cannot empty a folder
of its own it may not list or write (an agent's `chmod 000 d` under --environment=local): such folders are
made u+rwx and `rm -rf` runs again. And what lies under a folder, walked without recursion (os.walk recurses
once per level too)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator

DEEP_TIMEOUT = 300.0  # seconds for `rm -rf` on a tree rmtree could not remove


def remove_tree(path: str) -> None:
    """`path` and all below it gone, as far as the runner may remove them; never raises."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        _rm(path)
    if os.path.lexists(path) and (uid := os.geteuid()):  # root's rm needs no permission bit
        _open_up(path, uid)
        _rm(path)


def _rm(path: str) -> None:
    argv = ["rm", "-rf", "--one-file-system", "--", path]  # a file system mounted below stays (rmtree goes in)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=DEEP_TIMEOUT)


def _open_up(path: str, uid: int) -> None:
    """`uid`'s folders in `path` (itself too) made u+rwx, each before it is listed, so that rm can empty them."""
    with contextlib.suppress(OSError):  # a folder it still cannot list (another user's): rm leaves it, as before
        _let_in(path, uid)
        for entry in below(path):
            if entry.is_dir(follow_symlinks=False):
                _let_in(entry.path, uid)


def _let_in(folder: str, uid: int) -> None:
    """`folder`, when it is `uid`'s, made u+rwx. Opened O_PATH|O_NOFOLLOW and changed through that descriptor: a
    symlink (put in its place meanwhile) is not followed, so nothing outside the tree is changed. (A folder above
    swapped for a link would take a process of the sample's still running as the runner's uid, which could change
    what that uid owns itself: no more than it could do.)"""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            found = os.fstat(fd)
            if found.st_uid == uid and found.st_mode & 0o700 != 0o700:
                os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(found.st_mode) | 0o700)
        finally:
            os.close(fd)


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


def plain(folder: str, most: int) -> bool:
    """Whether `folder` is a folder (not a link to one) holding folders and regular files alone, none named .git,
    `most` entries at most in all; False too when one cannot be listed. No link is followed, and each folder is
    read only as far as needed: one of a million entries is not listed whole to answer."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return False
        folders, seen = [folder], 0
        while folders:
            with os.scandir(folders.pop()) as listed:
                for entry in listed:
                    seen += 1
                    if seen > most or entry.name == ".git":
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                    elif not entry.is_file(follow_symlinks=False):  # a link, FIFO, socket or device
                        return False
    except OSError:
        return False
    return True
