"""The loop devices of a run: its samples' disks (disk.py), each bound to an image in the run's temporary
folders. The kernel names a bound device's file in sysfs, by the path it was opened through (with " (deleted)"
once it is removed)."""

from __future__ import annotations

import os


def backing(device: int) -> str | None:
    """The path of the file the loop device `device` (a device number: a file system's st_dev) is bound to;
    None when it is no bound loop device."""
    try:
        with open(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/loop/backing_file", "rb") as name:
            return os.fsdecode(name.read().removesuffix(b"\n"))
    except OSError:
        return None


def of_run(device: int, prefix: str) -> bool:
    """Whether `device` is a loop device bound to a file whose path starts with `prefix` (the run's folders'
    common start, through no symlink: a disk's image)."""
    path = backing(device)
    return path is not None and path.startswith(prefix)
