"""What a run that is gone left in this machine's temporary folder, removed by the next run that starts here,
whatever its folder.

A run killed by SIGKILL (the OOM killer, `timeout -s KILL`) and never resumed, a nightly run named by its date,
left its samples' disks mounted (their loop devices bound, their images on the host's disk), their
workspaces, and what still ran in their cgroups, for as long as the host stayed up: only a --resume of
its folder removed them. Now every process that makes a run's temporary folders (make_workspace, before
its disks and cgroups) holds a shared lock on the run's marker, TMP/batch-runner-TAG.live, for its whole
life; a worker forked from it holds it too (the descriptor is inherited, closed at exec). The marker names
the run's folder and whether it keeps its workspaces. A run starting here (LocalBackend.prepare_run) takes
every other marker's lock exclusively, without waiting: where it gets it, no process of that run is left,
and what the run left is removed as its --resume would (LocalBackend.remove_leftovers), the marker last.
A run with a process still going holds its marker's lock, and a process of it that starts meanwhile waits
for the removal to end before it makes anything (and makes a new marker). A marker of another user, a link,
or one whose folder does not give its tag is left alone, and a run without a marker (an older version's)
is never touched. Only this machine's: a Ray node's leftovers go with the next run started on it."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import stat
import tempfile
from collections.abc import Callable

from trajforge.environments.settings import EnvironmentSettings

PREFIX, SUFFIX = "batch-runner-", ".live"
TRIES = 10  # opens of a marker that each went before it was held (another user's file in its place: all fail)
_held: dict[str, int] = {}  # this process's markers (run tag -> descriptor), inherited by a forked worker


def hold(settings: EnvironmentSettings) -> None:
    """This process holds the run's marker (made where there is none) until it ends. Never fails the run: where
    the marker cannot be held, the run's leftovers are only a --resume's to remove, as before."""
    tag = settings.run_tag
    if tag in _held:
        return
    path = _path(tag)
    marked = json.dumps({"run_dir": settings.run_dir, "keep_workspaces": settings.keep_workspaces}).encode()
    for _ in range(TRIES):  # again where it was removed meanwhile (its run's leftovers went): a new one
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:  # a link, or no room: none held
            return
        try:
            # Only a file of this user's is waited on: another user's at the name (a shared /tmp, where a run's
            # folder is guessed from its command line) was opened all the same (root, or a file left writable),
            # and that user's own lock on it held the run's start forever (review 21).
            if not _mine(os.fstat(fd)):
                os.close(fd)
                return
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits while another run removes this one's leftovers
            if _ours(fd, path):
                os.pwrite(fd, marked, 0)
                os.ftruncate(fd, len(marked))
                _held[tag] = fd
                return
        except OSError:
            pass
        os.close(fd)


def release(settings: EnvironmentSettings) -> None:
    """At the run's end, once what it left was removed: its marker goes where no process but this one (and the
    workers it forked, which share its lock) holds it, so that no later start looks at it."""
    fd = _held.pop(settings.run_tag, None)
    if fd is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a process of the run's own still holds it
        if _ours(fd, _path(settings.run_tag)):
            os.unlink(_path(settings.run_tag))
    except OSError:
        pass
    finally:
        os.close(fd)


def sweep(own: EnvironmentSettings, remove: Callable[[EnvironmentSettings], None]) -> list[str]:
    """The folders of the runs whose markers no process holds any more, their leftovers removed by `remove`."""
    swept = []
    for path in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), PREFIX + "*" + SUFFIX)):
        tag = os.path.basename(path)[len(PREFIX) : -len(SUFFIX)]
        if tag == own.run_tag:
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # a marker that is not one: left
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if not _ours(fd, path):
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a process of that run is still going
                    continue
                # Asked again now that it is held: another run's start may have removed this one's leftovers and
                # its marker meanwhile (after the look above), and a process of the run made a new marker since,
                # which it holds: the file held here is then no marker of anyone's any more (review 20).
                if not _ours(fd, path):
                    continue
                settings = _marked(fd)
                if settings is None:  # not one that this version wrote: left
                    continue
                if settings.run_tag == tag:
                    remove(settings)
                    swept.append(settings.run_dir)
                os.unlink(path)
            finally:
                os.close(fd)
    return swept


def _marked(fd: int) -> EnvironmentSettings | None:
    """The run a marker names, or None for a file that names none (any text: a JSON nested too deep for the
    parser raised RecursionError, which failed the start of every run of the machine's user: review 20)."""
    try:
        marked = json.loads(os.pread(fd, 1 << 16, 0))
        return EnvironmentSettings(
            run_dir=str(marked["run_dir"]), keep_workspaces=marked.get("keep_workspaces") is True
        )
    except (ValueError, RecursionError, LookupError, TypeError, AttributeError):
        return None


def _path(tag: str) -> str:
    return os.path.join(tempfile.gettempdir(), PREFIX + tag + SUFFIX)


def _ours(fd: int, path: str) -> bool:
    """The file open at `fd` is the one at `path` (not removed or replaced meanwhile), a plain file of this user's."""
    try:
        found, there = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (there.st_dev, there.st_ino) and _mine(found)


def _mine(found: os.stat_result) -> bool:
    """A plain file of this user's, with no other name."""
    return stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid() and found.st_nlink == 1
