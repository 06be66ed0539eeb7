"""A bwrap sample's /tmp where no disk image holds it (disk.py): a tmpfs of bounded size (--max_file_size_mb,
as its /dev/shm, and --max_disk_mb), mounted on the host folder that bwrap binds at /tmp: it is kept
between the sample's commands and goes with the sample. Mounting needs root in the host's mount
namespace; elsewhere /tmp is a plain folder and the run says so at start (limits.unenforced)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

from trajforge.environments.limits import host_user

MS_NOSUID, MS_NODEV, MNT_DETACH, UMOUNT_NOFOLLOW = 2, 4, 2, 8
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def possible() -> bool:
    """Root of the host (not of a user namespace of its own, where a mount would be refused)."""
    return host_user() is not None


def mount(path: str, size_mb: int, uid: int | None) -> bool:
    """Whether a tmpfs of `size_mb` now lies on `path`, owned by `uid` (the sandbox's host user)."""
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    options = f"size={size_mb}m,mode=0700{owner}".encode()
    return _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options) == 0


def unmount(path: str) -> bool:
    """Whatever is mounted on `path` unmounted, lazily (a process still in it keeps it until it ends), also
    what a local command (root) mounted over it; whether nothing is mounted there any more."""
    for _ in range(MOUNTS_OVER):
        if _libc.umount2(os.fsencode(path), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
            return ctypes.get_errno() in (errno.EINVAL, errno.ENOENT)  # not a mount point (any more), or gone
    return False


MOUNTS_OVER = 64  # mounts on one path unmounted at most (one is ours)


def mounted_below(prefix: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of what is mounted under `prefix` (its folders' common start)."""
    with open("/proc/self/mounts") as mounts:
        found = [(fields[1].encode().decode("unicode_escape"), fields[2]) for fields in map(str.split, mounts)]
    return [(point, kind) for point, kind in found if point.startswith(prefix)]
