"""A bwrap sample's /tmp where no disk image holds it (disk.py): a tmpfs of bounded size (--max_file_size_mb,
as its /dev/shm, and --max_disk_mb), mounted on the host folder that bwrap binds at /tmp: it is kept
between the sample's commands and goes with the sample. Mounting needs root in the host's mount
namespace; elsewhere /tmp is a plain folder and the run says so at start (limits.unenforced)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re

from trajforge.environments.libc import libc
from trajforge.environments.limits import host_user

MS_NOSUID, MS_NODEV, MNT_DETACH, UMOUNT_NOFOLLOW = 2, 4, 2, 8


def possible() -> bool:
    """Root of the host (not of a user namespace of its own, where a mount would be refused)."""
    return host_user() is not None


def mount(path: str, size_mb: int, uid: int | None) -> bool:
    """Whether a tmpfs of `size_mb` now lies on `path`, owned by `uid` (the sandbox's host user)."""
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    options = f"size={size_mb}m,mode=0700{owner}".encode()
    return libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options) == 0


def unmount(path: str) -> bool:
    """Whatever is mounted on `path` unmounted, lazily (a process still in it keeps it until it ends), also
    what a local command (root) mounted over it; whether nothing is mounted there any more."""
    for _ in range(MOUNTS_OVER):
        if libc.umount2(os.fsencode(path), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
            return ctypes.get_errno() in (errno.EINVAL, errno.ENOENT)  # not a mount point (any more), or gone
    return False


MOUNTS_OVER = 64  # mounts on one path unmounted at most (one is ours)


def unmount_listed(point: str) -> bool:
    """`point`, as the mount table names it (through no symlink), unmounted only while its path reaches it through
    none: a folder above it may lie below a mount a root command put there (a folder of the host's, bound more
    times than one unmount lets go of), and a link of that folder's name in it had the host's own mount at its
    target unmounted (a link to /: its /sys). False then, as for a point that stays mounted. The folder is held from
    its look to the unmounting, which goes through it: a link put in a folder's place meanwhile (by a process that
    left its cgroup, still running) is not followed."""
    folder = os.path.dirname(point)
    try:
        held = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # gone, or a link a moment ago and not now (the mount over a folder above it unmounted)
        return False
    try:
        return os.readlink(f"/proc/self/fd/{held}") == folder and unmount(
            f"/proc/self/fd/{held}/{os.path.basename(point)}"
        )
    finally:
        os.close(held)


def mounts(*within: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of the mounts of this process's namespace whose line holds one of
    `within` (paths, through no symlink; none: no mount), each point as the kernel wrote it (octal escapes for
    space, tab, newline and backslash; every other byte as it is, also a carriage return, vertical tab or form
    feed, which bytes.split would have cut a point at: fields are split at single spaces, lines at newlines
    alone). Only those lines are parsed: at 200 samples in flight a local run has 400 mounts, and parsing them
    all cost each sample's end as much again as the kernel's writing of the table. Each path is looked for by
    itself: the common start of a sample's folders is the temporary folder, which every sample's mount line
    holds."""
    needles = [_escaped(path) for path in within]
    with open("/proc/self/mounts", "rb") as table:
        lines = table.read().split(b"\n")
    fields = [line.split(b" ") for line in lines if any(needle in line for needle in needles)]
    return [(_unescaped(found[1]), os.fsdecode(found[2])) for found in fields]


def unmount_of(devices: set[int]) -> None:
    """Every mount of a file system of `devices` (device numbers) unmounted lazily, wherever it lies (a loop device
    of a run's file a root command mounted on a folder of the host's), each through its path only while that
    reaches a mount of one of them: a folder of the host's mounted over it since stays, and so does what it covers."""
    with open("/proc/self/mountinfo", "rb") as table:
        fields = [line.split(b" ") for line in table.read().split(b"\n")]
    for found in fields:  # the mount's id, its parent's, its device (major:minor), its root, its point, ...
        numbers = found[2].split(b":") if len(found) > 4 else []
        if len(numbers) == 2 and os.makedev(*map(int, numbers)) in devices:
            with contextlib.suppress(OSError):
                point = os.open(_unescaped(found[4]), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    if os.fstat(point).st_dev in devices:  # not what another mounted over it: unmounted as it is
                        libc.umount2(f"/proc/self/fd/{point}".encode(), MNT_DETACH)
                finally:
                    os.close(point)


# The bytes the kernel's mangle_path writes as octal escapes in /proc/self/mounts: backslash, space, tab, newline.
ESCAPES = {ord(char): f"\\{ord(char):03o}".encode() for char in "\\ \t\n"}


def _escaped(path: str) -> bytes:
    """`path` as /proc/self/mounts writes it."""
    return b"".join(ESCAPES.get(byte, bytes([byte])) for byte in os.fsencode(path))


def _unescaped(point: bytes) -> str:
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda found: bytes([int(found[1], 8)]), point))


def real(path: str) -> str:
    """`path` as the kernel writes a mount point: through no symlink (a TMPDIR that is one, say)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def mounted_below(prefix: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of what is mounted under `prefix` (its folders' common start), the
    folder holding them taken through no symlink, as /proc/self/mounts names them."""
    start = real(prefix)
    return [(point, kind) for point, kind in mounts(start) if point.startswith(start)]


def detach_below(folders: list[str]) -> None:
    """What is mounted on or below any of `folders` unmounted lazily, outermost first (which takes what lies
    below it along): a root runner's local command mounts in the host's namespace, and shutil.rmtree goes into
    a mount, so emptying a folder where a chroot left `mount --bind /dev jail/dev` (or `mount --bind DIR .`)
    emptied the host's /dev. The folders are matched as the kernel names mount points, their temporary folder
    through no symlink (a TMPDIR that is one missed every mount), never a symlink in a folder's own place (a root
    command moved its workspace aside and put one there: every mount below where it pointed was unmounted, the
    host's own). No folders: nothing to do (a sample whose start failed before its workspace was made). OSError
    when one stays mounted."""
    paths = [real(folder) for folder in folders]
    inside = tuple(path.rstrip("/") + "/" for path in paths)
    listed = mounts(*paths)
    found = sorted({point for point, _ in listed if point in paths or point.startswith(inside)}, key=len)
    if not all(unmount_listed(point) for point in found):
        raise OSError(f"cannot unmount what a command mounted at {found[0]}")
