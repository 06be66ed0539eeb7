"""The loop devices of a run: its samples' disks (disk.py), each bound to an image in the run's temporary folders,
and those a root local command made and left bound (`losetup -f` sets no autoclear: bound for the host's life), of
a file in a workspace, of its disk's image, or of a file on such a device. One bound to a file on a sample's disk
holds the disk too: its file system outlives its unmounting, and with it the disk's loop device and its image's
blocks, the image gone from the temporary folder. The kernel names a device's file in sysfs by the path it was
opened through (" (deleted)" once it is removed, relative to its mount once that is let go of): a device is the
run's when that path lies in the run's folders, or when its file lies on a device of the run's (whatever its path
then), however deep. No other device is touched: another run's disks, the host's own."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
from collections.abc import Iterator

from trajforge.environments import tmpfs

LOOP_SET_FD, LOOP_CLR_FD, LOOP_SET_STATUS64, LOOP_GET_STATUS64, LOOP_CONFIGURE = 0x4C00, 0x4C01, 0x4C04, 0x4C05, 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82
# The loop control's number, fixed in the kernel (MISC_MAJOR, LOOP_CTRL_MINOR): sysfs names it only once the loop
# module is loaded, which the control's opening does (a host where it was not yet: every disk failed).
CONTROL = os.makedev(10, 237)
LO_FLAGS_AUTOCLEAR = 4  # the loop device is freed when its last mount goes
LOOP_INFO64 = "5Q4I64s64s32s2Q"  # struct loop_info64: lo_device (its file's device) first, lo_flags the 9th field
AUTOCLEAR_INFO = struct.pack(LOOP_INFO64, *[0] * 8, LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0)


def of_run(device: int, prefix: str) -> bool:
    """Whether `device` (a file system's st_dev) is a loop device bound to a file whose path starts with `prefix`
    (the run's folders' common start, through no symlink: a disk's image)."""
    path = _backing(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
    return path is not None and path.startswith(prefix)


def let_go(prefix: str) -> None:
    """Every loop device of the run whose folders start with `prefix` detached (LOOP_CLR_FD), its mounts outside the
    run's folders unmounted first (`mount -o loop` on a folder of the host's): at once where nothing uses it any
    more, else with its last user (the kernel makes it autoclear: a mount no path reaches). Each device is held open
    from its reading to its detaching, so that it stays bound as read: a device of the run's freed meanwhile and
    bound again by another (another run's `losetup -f`, which the lowest free number goes to) is never detached in
    its place."""
    with contextlib.ExitStack() as held:
        bound = _bound(held)
        run = {number for number, (_, path, _) in bound.items() if path.startswith(prefix)}
        while more := {number for number, (_, _, on) in bound.items() if on in run} - run:  # a file on one of them
            run |= more
        tmpfs.unmount_of(run)
        for number in run:
            with contextlib.suppress(OSError):
                fcntl.ioctl(bound[number][0], LOOP_CLR_FD)


def _bound(held: contextlib.ExitStack) -> dict[int, tuple[int, str, int]]:
    """The host's bound loop devices, each opened and held in `held`: by number, its descriptor, the path of its
    file and the device that file lies on."""
    found = {}
    for name in os.listdir("/sys/block"):
        if not name.startswith("loop") or _backing(f"/sys/block/{name}") is None:  # bound to nothing: not opened
            continue
        with contextlib.suppress(OSError):
            loop = held.enter_context(opened(name))
            info = fcntl.ioctl(loop, LOOP_GET_STATUS64, bytes(struct.calcsize(LOOP_INFO64)))  # ENXIO: unbound since
            path = _backing(f"/sys/block/{name}")
            if path is not None:
                found[os.fstat(loop).st_rdev] = (loop, path, struct.unpack_from("Q", info)[0])
    return found


def _backing(device: str) -> str | None:
    """The path of the file the loop device at `device` (its folder in sysfs) is bound to; None for none."""
    try:
        with open(f"{device}/loop/backing_file", "rb") as name:
            return os.fsdecode(name.read().removesuffix(b"\n"))
    except OSError:
        return None


@contextlib.contextmanager
def opened(name: str, flags: int = os.O_RDONLY) -> Iterator[int]:
    """The loop device `name` (or the loop devices' control, "loop-control") opened with `flags` through its node in
    /dev once that is checked to be it, the node as looked at (a root command may put another there: a FIFO, whose
    opening waits for a writer for good; another device's, which opening arms, as a watchdog's, or which was read
    and detached or bound as this one, another loop device's). OSError for any other node, also when the node is
    opened as another file: the node is opened again through /proc/self/fd, where such a command may have mounted
    a folder of links (to another device's node: its opening is not undone, its use is)."""
    node = os.open(f"/dev/{name}", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(node)
        if name == "loop-control":
            right = stat.S_ISCHR(info.st_mode) and info.st_rdev == CONTROL
        else:  # its minor depends on the module's max_part: as sysfs has it
            with open(f"/sys/block/{name}/dev", "rb") as number:
                major, minor = map(int, number.read().split(b":"))
            right = stat.S_ISBLK(info.st_mode) and info.st_rdev == os.makedev(major, minor)
        if not right:
            raise OSError(errno.ENODEV, f"/dev/{name} is not that device")
        fd = os.open(f"/proc/self/fd/{node}", flags | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO there: no wait
    finally:
        os.close(node)
    try:
        reopened = os.fstat(fd)
        if (reopened.st_dev, reopened.st_ino) != (info.st_dev, info.st_ino):  # a folder of links over /proc/PID/fd
            raise OSError(errno.ENODEV, f"/dev/{name} was opened as another file")
        yield fd
    finally:
        os.close(fd)
