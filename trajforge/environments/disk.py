"""A sample's disk bounded (--max_disk_mb): its workspace, bwrap's /tmp and its clean room's /tmp lie
together on a file system of their own, an ext4 image of that size on a loop device, with one inode per INODE_BYTES
of it. A write past either bound fails inside the sample (ENOSPC), and the host's disk gives at most
the image's size to each sample in flight (the image is sparse and mounted with `discard`: what a
sample deletes goes back to the host).

mkfs.ext4 runs once per worker, run and size (it is a process of its own and opens every loop device of the
host), on a template never mounted and kept in memory, its data extents alone (~230 KB for 10 GB): every
image of that size is those bytes, its holes left holes. A sample's workspace is a folder of
its image bind-mounted on the workspace's usual path (the same path on every run, as the response cache
needs). Under bwrap a worker keeps an image per slot: at a sample's end the folder is emptied and the image
given back, or dropped when it cannot be emptied. Under local, whose commands reach the disk's root, its
image and the host's mounts, a sample's image goes with it. Mounting
needs root in the host's mount namespace, mkfs.ext4, loop devices and sysfs; elsewhere the run says at start
that the bound is not enforced (limits.unenforced)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import random
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from trajforge.environments import loops, mountns, programs, tmpfs
from trajforge.environments.libc import libc
from trajforge.environments.limits import MB, RUNNER
from trajforge.environments.settings import EnvironmentSettings
from trajforge.environments.trees import remove_tree
from trajforge.errors import SetupError

INODE_BYTES = 16 * 1024  # ext4's own default ratio: 655,360 inodes in 10 GB
SYSTEM = "/usr/sbin:/sbin:/usr/bin:/bin"  # searched too: a runner's PATH may lack the sbin folders
MKFS = programs.find("mkfs.ext4", SYSTEM)
# No journal (a sample's files need no crash safety), inode tables neither zeroed now nor later (a
# sparse image reads as zeros): an image costs milliseconds and no host disk until it is written.
MKFS_OPTIONS = ["-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard"]
# The image is mounted by system calls, not mount(8): libmount reads the host's whole mount table,
# hundreds of lines with a run's disks, several times per image (13 ms of CPU each at 200 in flight).
MOUNT_DATA = b"noinit_itable,discard"
MS_NOSUID, MS_NODEV, MS_BIND = 2, 4, 4096
# A loop device another binder took first: waited for, up to BUSY_WAIT doubled at each attempt (at most
# BUSY_WAIT_MOST), at random, until both BIND_ATTEMPTS attempts and BIND_TIMEOUT seconds have gone by
# (_mount_image): where each ioctl is slow (a traced worker, a host under load) a few attempts fill the time.
BUSY_WAIT, BUSY_WAIT_MOST, BIND_TIMEOUT, BIND_ATTEMPTS = 0.001, 0.05, 10.0, 100
# Room on the disk kept for the verification, in a folder at the disk's root (beside the workspace's and the
# /tmp folders, in none of them: no sandboxed command sees it) and given back when the verification's first
# command is about to run: its HOME and a few files fit whatever the agent left. Made with the disk and kept
# from one sample to the next while no verification takes it; checked whole before each sample, re-made when
# it is not. Its blocks lie in one file, its other files hold an inode each: given back, the `discard` mount
# frees one extent (0.8 ms of CPU to make and give back, and the loop device's one hole punched), where 32
# files of 32 KB took 1.8 ms and 32 holes.
RESERVE = "reserve"
RESERVE_FILES, RESERVE_BYTES = 32, MB  # inodes and blocks
RESERVE_NAMES = frozenset(str(n) for n in range(RESERVE_FILES))
RESERVE_BLOCKS = "0"  # the file that holds the blocks


@functools.cache
def possible() -> bool:
    """Root of the host, mkfs.ext4 and loop devices, and sysfs (loops.opened checks a device's node by its number
    there: with no sysfs mounted, every disk failed)."""
    return tmpfs.possible() and MKFS is not None and os.path.exists("/dev/loop-control") and os.path.isdir("/sys/block")


@dataclass
class Disk:
    """One image, mounted at `root`; `folder` is where it lies with its image (a run's temporary folder)."""

    folder: str
    root: str
    namespace: mountns.SlotMounts | None = None  # where bwrap's commands start (mountns.py), made on first use
    new: tuple[int, int] = (0, 0)  # blocks and inodes in use on the disk as made (its folders, no reserve)
    made: tuple[int, int] = (0, 0)  # (device, inode) of `folder` as made: another folder mounted over it is not it
    device: int = 0  # its file system's, as mounted: a copy of its files takes none of another (copy_files)

    @property
    def tests(self) -> str:
        """The folder of the slot's hidden tests: beside the image, not on it, so that writing them never
        depends on the room the agent left (the slot's mount namespace binds it too: mountns.py)."""
        return os.path.join(self.folder, "tests")

    def make_folder(self, name: str, parent: str = "") -> str:
        """A fresh folder on the disk, or in `parent` (the tests' folder)."""
        path = os.path.join(parent or self.root, f"{name}-{uuid.uuid4().hex[:12]}")
        os.mkdir(path, 0o700)
        return path

    def attach(self, folder: str, mount_point: str) -> None:
        """`folder` of this disk seen at `mount_point` (an empty folder of the host)."""
        if libc.mount(os.fsencode(folder), os.fsencode(mount_point), None, MS_BIND, None) != 0:
            raise SetupError(f"--max_disk_mb: cannot bind the sample's disk: {os.strerror(ctypes.get_errno())}")

    def emptied(self) -> bool:
        """Everything the sample left removed (its tests too), the verification's reserve kept if it is whole;
        whether the disk is empty now (else it is not used again). Only a sample whose commands never saw the
        disk's root gives its disk back (bwrap's): nothing of it was mounted over, pinned or written raw."""
        whole = _whole(os.path.join(self.root, RESERVE))
        kept = {"lost+found", RESERVE} if whole else {"lost+found"}
        for folder in (self.root, self.tests):
            for entry in os.listdir(folder):
                if entry not in kept:
                    remove_tree(os.path.join(folder, entry))
        found = os.path.join(self.root, "lost+found")
        if not (set(os.listdir(self.root)) <= kept and not os.listdir(self.tests) and not os.listdir(found)):
            return False
        # Nothing unnamed holds room either: a file whose last reference lies in flight on a unix socket
        # cycle of the agent's (SCM_RIGHTS) keeps its blocks and inode after every process and name is gone,
        # until the kernel's unix GC runs, which nothing here triggers. A file a killed process of the
        # sample's was still letting go of holds them a moment (seen under load: one inode and one block):
        # looked at again for up to SETTLE seconds before the disk is dropped.
        deadline = time.monotonic() + SETTLE
        while not self._holds_no_more(whole):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _holds_no_more(self, whole: bool) -> bool:
        """The disk uses no more blocks and inodes than when it was made, besides its reserve when `whole`."""
        info = os.statvfs(self.root)
        blocks, inodes = _in_use(info)
        if whole:
            blocks -= RESERVE_BYTES // info.f_frsize + 1  # its file's blocks and its folder's
            inodes -= RESERVE_FILES + 1
        return blocks <= self.new[0] + SLACK_BLOCKS and inodes <= self.new[1]

    def reserve(self) -> None:
        """The verification's reserve on the disk, before the agent could fill it: the one kept from an earlier
        sample when it is whole (its files, each its blocks allocated, nothing else), else made anew. Blocking."""
        folder = os.path.join(self.root, RESERVE)
        if not _whole(folder):
            _remove(folder)
            _allocate(folder)

    def release(self) -> None:
        """The reserve given back to the disk (once nothing of the agent's runs): the verification's room. Blocking."""
        _remove(os.path.join(self.root, RESERVE))

    def drop(self) -> None:
        if self.namespace is not None:
            self.namespace.close()
            self.namespace = None
        _remove_folder(self.folder, self.made)


FOLDER_FILES = (("image", False), ("fs", True), ("tests", True))  # what `take` makes in a disk's folder, is it one


def _remove_folder(folder: str, made: tuple[int, int]) -> None:
    """A disk's folder, once its image is unmounted, removed with what `take` made in it, each entry by name
    (rmdir, unlink), never walked into: a local command (root) reaches the folder too and may have mounted a host
    folder in it, on its tests' folder or over it whole, which rmtree would have emptied. Both reach it through
    its descriptor, after it is checked to be the folder made: through its path, the unmounting went through a
    folder of the host's a command bound over the temporary folder, and a link of the folder's name in it, and
    unmounted the host's own mount below the link's target. Whatever else is there, or stays mounted, is left
    for the run's end, which unmounts before it removes (remove_leftovers)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != made or not tmpfs.unmount(f"/proc/self/fd/{fd}/fs"):
            return
        for name, is_folder in FOLDER_FILES:
            with contextlib.suppress(OSError):
                (os.rmdir if is_folder else os.unlink)(name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(folder)


_free: dict[tuple[str, int], list[Disk]] = {}  # this worker's images not in use, by (run, size in MB)
# This worker's pristine image of each (run, size in MB), made by mkfs on first use (_template): its data
# (offset, bytes; about 230 KB for 10 GB) kept in memory and its file removed at once, so that nothing on the
# host's disk lies there for a local command (root) to write into and every later disk to inherit. None: the
# host's file system does not tell holes from data, and each image is made by mkfs.
_templates: dict[tuple[str, int], list[tuple[int, bytes]] | None] = {}
_making = threading.Lock()  # one template made at a time: the samples opening together wait for the first


@atexit.register
def _drop_free() -> None:
    """At this process's end, its images go (a killed worker's: the run's remove_leftovers)."""
    for disks in _free.values():
        while disks:
            disks.pop().drop()


SLACK_BLOCKS = 16  # a folder of the root's grown by a block, an extent tree's block
SETTLE = 1.0  # seconds a disk given back has to let go of what a killed process held


def _in_use(info: os.statvfs_result) -> tuple[int, int]:
    """Blocks and inodes in use on a file system, from its statvfs."""
    return info.f_blocks - info.f_bfree, info.f_files - info.f_ffree


def _forget() -> None:
    """A forked worker starts without its parent's free images (the driver's, kept after the MCP servers'
    start listing): two processes taking one image empty each other's workspaces as each sample gives it
    back. Its templates, pristine bytes, it keeps."""
    global _making
    _free.clear()
    _making = threading.Lock()  # another thread of the parent may have held it


os.register_at_fork(after_in_child=_forget)


def _allocate(folder: str) -> None:
    """RESERVE_FILES files in a new `folder`, RESERVE_BYTES allocated to the first (RESERVE_BLOCKS)."""
    os.mkdir(folder, 0o700)
    for name in RESERVE_NAMES:
        fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            if name == RESERVE_BLOCKS:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)


def _whole(folder: str) -> bool:
    """`folder` is a reserve as _allocate made it, never trusted otherwise: the runner's folder holding
    exactly its files, each a plain file of the runner's with one link, RESERVE_BLOCKS's blocks allocated."""
    me = os.geteuid()
    try:
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != me or stat.S_IMODE(info.st_mode) != 0o700:
            return False
        fd = os.open(folder, DIRECTORY)
        try:
            if set(os.listdir(fd)) != RESERVE_NAMES:
                return False
            for name in RESERVE_NAMES:
                part = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(part.st_mode) or part.st_nlink != 1 or part.st_uid != me:
                    return False
                if name == RESERVE_BLOCKS and part.st_blocks * 512 < RESERVE_BYTES:
                    return False
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def _remove(path: str) -> None:
    """`path` gone, whatever it is (a folder, or a file or link in its place)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            remove_tree(path)
        else:
            os.unlink(path)


def unenforced(size_mb: int, kind: str, enforcer: str) -> str | None:
    """The warning to print once when --max_disk_mb cannot be enforced by the `kind` of environment here,
    whose limits `enforcer` enforces (its Backend.LIMITS: the runner's are local's and bwrap's)."""
    if not size_mb:
        return None
    if enforcer == RUNNER and not possible():
        return (
            f"--max_disk_mb not enforced by --environment={kind}: its disk image needs the host's root, "
            "mkfs.ext4 (e2fsprogs), loop devices and sysfs"
        )
    if enforcer != RUNNER:
        return f"--max_disk_mb not enforced by --environment={kind}: a sample's files are bounded by its own storage"
    return None


def take(settings: EnvironmentSettings, prefix: str) -> Disk:
    """A free disk of this worker, else a new one, made in a temporary folder named from `prefix` (the
    run's, so that remove_leftovers finds it). SetupError when it cannot be made: the sample fails
    rather than run unbounded."""
    size = settings.limits.max_disk_mb
    free = _free.setdefault((settings.run_tag, size), [])
    while True:
        try:
            disk = free.pop()  # one step (another thread may take the last image between a test and a pop)
        except IndexError:
            break
        if os.path.ismount(disk.root):  # a later run of this process (--rescore) may have removed it as a leftover
            return disk
        disk.drop()
    folder = tempfile.mkdtemp(prefix=prefix + "disk-")
    made = os.lstat(folder)
    disk = Disk(folder, os.path.join(folder, "fs"), made=(made.st_dev, made.st_ino))
    image = os.path.join(folder, "image")
    try:
        os.mkdir(disk.root)
        os.mkdir(disk.tests, 0o711)
        _make_image(image, settings.run_tag, size, prefix)
        _mount_image(image, disk.root)
        for path in (folder, disk.root, disk.tests):  # passed through, not listed, by the sandbox's uid to its folders
            os.chmod(path, 0o711)
        disk.new = _in_use(os.statvfs(disk.root))
        disk.device = os.stat(disk.root).st_dev
    except (OSError, subprocess.TimeoutExpired) as exc:
        disk.drop()
        raise SetupError(f"--max_disk_mb: cannot make the sample's disk of {size} MB: {exc}") from None
    return disk


def _make_image(image: str, run_tag: str, size: int, prefix: str) -> None:
    """A new ext4 image of `size` MB at `image`: this worker's template of that size written into it, its
    holes left holes (made by mkfs itself where the template could not be read so)."""
    extents = _template(run_tag, size, prefix)
    if extents is None:
        _mkfs(image, size)
        return
    fd = _new_image(image, size)
    try:
        for offset, data in extents:
            os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _template(run_tag: str, size: int, prefix: str) -> list[tuple[int, bytes]] | None:
    """This worker's pristine image of `size` MB for the run (_templates), made by mkfs on first use in a
    folder of the run's temporary area that goes at once."""
    with _making:
        if (run_tag, size) not in _templates:
            folder = tempfile.mkdtemp(prefix=prefix + "disk-template-")
            try:
                image = os.path.join(folder, "image")
                _mkfs(image, size)
                _templates[(run_tag, size)] = _extents(image)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        return _templates[(run_tag, size)]


def _extents(image: str) -> list[tuple[int, bytes]] | None:
    """The data of the file at `image` with their offsets; None when there is more of it than the file's
    allocated blocks (a file system that does not tell holes from data: 10 GB of zeros)."""
    fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        room, extents = info.st_blocks * 512, []
        for start, end in _data_ranges(fd, info.st_size):
            room -= end - start
            if room < 0:
                return None
            extents.append((start, os.pread(fd, end - start, start)))
        return extents
    finally:
        os.close(fd)


def _data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each run of data in the file at `fd`, its holes skipped."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no data after `offset`
                raise
            return
        offset = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, offset


def _new_image(image: str, size: int) -> int:
    """A new file at `image` of `size` MB, all a hole, opened for writing. 0600: an image holds a sample's
    files raw, for no other user of the host to read."""
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size * MB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mkfs(image: str, size: int) -> None:
    """An ext4 image of `size` MB made at `image` by mkfs.ext4, one inode per INODE_BYTES of it."""
    os.close(_new_image(image, size))
    inodes = str(max(size * MB // INODE_BYTES, 64))
    argv = [str(MKFS), *MKFS_OPTIONS, "-N", inodes, image]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if done.returncode:
        raise OSError(done.stderr.strip() or f"{argv[0]} exited with {done.returncode}")


def _mount_image(image: str, root: str) -> None:
    """The ext4 `image` mounted at `root` on a free loop device, which goes with the mount (autoclear).

    The kernel names the lowest unbound device free, also while another thread or process is binding it:
    binding writes the backing file's dirty pages out first, the device claimed and still unbound, and every
    other binder is told EBUSY meanwhile. So the image's pages are written out here, before (the binding then
    takes microseconds), and a binder told EBUSY waits a random while, longer each time, before it asks for
    the free device again: 100 attempts at once were used up in one binding's write-out (3 processes of 16
    threads each making disks: a few disks in 1000 failed, "no free loop device"). The nodes are checked as
    opened (loops.opened) and the device is mounted through its descriptor: a root local command may put
    another device's node at /dev/loopN meanwhile, and that device was mounted as the sample's disk. That
    descriptor is named by a path too, which such a command may cover as well (a folder of links mounted
    over the worker's /proc/PID/fd): what is mounted at `root` is checked to be the device bound, else the
    disk fails (its mount goes with it, take)."""
    with loops.opened("loop-control", os.O_RDWR) as control, _opened(image) as backing:
        os.fsync(backing)
        deadline, wait, attempts = time.monotonic() + BIND_TIMEOUT, BUSY_WAIT, 0
        while True:
            attempts += 1
            number = fcntl.ioctl(control, loops.LOOP_CTL_GET_FREE)
            with loops.opened(f"loop{number}", os.O_RDWR) as loop:
                try:
                    _bind(loop, backing)
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
                else:
                    try:
                        device = f"/proc/self/fd/{loop}".encode()  # the device checked, not what its path is now
                        if libc.mount(device, os.fsencode(root), b"ext4", MS_NOSUID | MS_NODEV, MOUNT_DATA) != 0:
                            raise OSError(ctypes.get_errno(), f"mount: {os.strerror(ctypes.get_errno())}")
                        if os.lstat(root).st_dev != os.fstat(loop).st_rdev:  # its path led elsewhere: dropped (take)
                            raise OSError(errno.ENODEV, "mount: the device mounted there is not the disk's")
                    except BaseException:
                        fcntl.ioctl(loop, loops.LOOP_CLR_FD)
                        raise
                    return
            if attempts >= BIND_ATTEMPTS and time.monotonic() > deadline:
                raise OSError(f"no free loop device in {attempts} attempts and {BIND_TIMEOUT:g} s")
            # With the device closed; the bound doubled as a float each time (BUSY_WAIT * 2**attempt was no float
            # past 1,023 attempts, about 25 s of such waits: OverflowError left take(), not this OSError).
            time.sleep(random.uniform(0, wait))
            wait = min(2 * wait, BUSY_WAIT_MOST)


def _bind(loop: int, backing: int) -> None:
    """The loop device `loop` bound to the file `backing`, freed when its last user goes (autoclear). In one
    step (LOOP_CONFIGURE, Linux 5.8): bound first and flagged after, a worker killed between the two left the
    device bound to its image for the host's life, no mount to find it by (review 16). Older kernels: two steps."""
    config = struct.pack("2I", backing, 0) + loops.AUTOCLEAR_INFO + bytes(64)  # loop_config: fd, block size, info
    try:
        fcntl.ioctl(loop, loops.LOOP_CONFIGURE, config)
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTTY):
            raise
    fcntl.ioctl(loop, loops.LOOP_SET_FD, backing)
    try:
        fcntl.ioctl(loop, loops.LOOP_SET_STATUS64, loops.AUTOCLEAR_INFO)
    except BaseException:
        fcntl.ioctl(loop, loops.LOOP_CLR_FD)
        raise


@contextlib.contextmanager
def _opened(path: str):
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def copy_files(source: str, target: str, device: int, workspace: str = "") -> None:
    """The files, folders and symlinks below `source` on `device` (a sample's disk) copied into `target`, a folder
    of the runner's that no other user can enter (--keep_workspaces). What lies on another file system is left
    out: a host folder or file a root command mounted among the sample's files (a chroot's /etc), or over
    `source` itself. The runner is root and its copies land on the host's disk, so a copy gives the host no
    more than the disk held: each entry is its source's uid and gid with its permission bits alone (no setuid,
    setgid or sticky bit, no extended attribute), holes stay holes, hard links stay one file, and the data
    written stops at the disk's size (a folder of the disk bound again below another is copied twice). No
    symlink is followed and every entry is opened below its folder's descriptor: a name swapped meanwhile is
    copied as what it is or left out, never written through. A FIFO, socket or device is left out: copying
    one blocks, fails or reads a device, and none is a file of the work. What is left out beyond the disk's
    size or could not be copied is said in disk.notes (`take_notes`), naming `workspace` (else `target`: the
    folder the files are kept in), the rest kept. Nothing is written when `target` is no folder (a root command
    put a symlink in its place)."""
    disk = os.statvfs(source)
    size = disk.f_blocks * disk.f_frsize
    copy = _Copy(size, device)
    try:
        dst = os.open(target, DIRECTORY)
    except OSError as exc:
        notes.append(f"--keep_workspaces: the workspace could not be kept in {target}: {exc.strerror}")
        return
    copy.root = dst
    try:
        src = os.open(source, DIRECTORY)
        try:
            if os.fstat(src).st_dev == device:
                copy.folder(src, dst, ())
            else:
                copy.left_out += 1
        finally:
            os.close(src)
    finally:
        os.close(dst)
    if copy.left_out:
        why = "their data passed the size of the sample's disk (--max_disk_mb)" if copy.room < 0 else "not copied"
        kept = workspace or target
        notes.append(f"--keep_workspaces: {copy.left_out} entries of the workspace kept in {kept} left out: {why}")


DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = MB
MAX_DEPTH = 128  # folders in folders copied (two descriptors open per level); deeper ones are left out
notes: list[str] = []  # what this process's copies left out, for the run to say (take_notes)


def take_notes() -> list[str]:
    """The notes since the last call (the worker sends them to the driver after each sample)."""
    taken = notes[:]
    del notes[: len(taken)]
    return taken


class _Full(Exception):
    """The copy has written the disk's size."""


class _Copy:
    def __init__(self, room: int, device: int):
        self.room = room  # bytes still to write; negative once the copy stopped there
        self.device = device  # the disk's: what lies on another file system is left out
        self.root = -1  # the target's descriptor: hard links are made relative to it
        self.links: dict[tuple[int, int], str] = {}  # (dev, ino) of a linked source: its first copy's path
        self.left_out = 0

    def folder(self, src: int, dst: int, path: tuple[str, ...]) -> None:
        """What `src` holds copied into `dst` (at `path` below the target)."""
        for name in sorted(os.listdir(src)):
            if self.room < 0:
                self.left_out += 1
                continue
            try:
                self.entry(src, dst, name, (*path, name))
            except _Full:
                self.room = -1
                self.left_out += 1
            except OSError:
                self.left_out += 1

    def entry(self, src: int, dst: int, name: str, path: tuple[str, ...]) -> None:
        info = os.stat(name, dir_fd=src, follow_symlinks=False)
        if info.st_dev != self.device:  # mounted there, by a root command
            raise OSError(errno.EXDEV, "not on the sample's disk")
        if stat.S_ISREG(info.st_mode):
            self.file(src, dst, name, path)
        elif stat.S_ISDIR(info.st_mode):
            if len(path) > MAX_DEPTH:
                raise OSError(errno.ELOOP, "folders too deep")
            self.subfolder(src, dst, name, path)
        elif stat.S_ISLNK(info.st_mode):  # copied as a link (else a FIFO, socket or device: left out)
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
            os.chown(name, info.st_uid, info.st_gid, dir_fd=dst, follow_symlinks=False)
            os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=dst, follow_symlinks=False)

    def subfolder(self, src: int, dst: int, name: str, path: tuple[str, ...]) -> None:
        inner = os.open(name, DIRECTORY, dir_fd=src)
        try:
            os.mkdir(name, 0o700, dir_fd=dst)
            made = os.open(name, DIRECTORY, dir_fd=dst)
            try:
                self.folder(inner, made, path)
                _settle(made, os.fstat(inner))  # only now another uid's: nothing more is written in it
            finally:
                os.close(made)
        finally:
            os.close(inner)

    def file(self, src: int, dst: int, name: str, path: tuple[str, ...]) -> None:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=src)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):  # swapped for something else since it was listed
                return
            key = (info.st_dev, info.st_ino)
            if info.st_nlink > 1 and key in self.links:
                os.link(self.links[key], name, src_dir_fd=self.root, dst_dir_fd=dst, follow_symlinks=False)
                return
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst)
            try:
                self.data(fd, out, info.st_size)
                _settle(out, info)
            except BaseException:
                os.unlink(name, dir_fd=dst)  # no part of a file: it is kept whole or not at all
                raise
            finally:
                os.close(out)
            if info.st_nlink > 1:
                self.links[key] = os.path.join(*path)
        finally:
            os.close(fd)

    def data(self, src: int, out: int, size: int) -> None:
        """The data of `src` written at its offsets in `out`, its holes left holes; _Full past the room."""
        for start, end in _data_ranges(src, size):
            while start < end:
                chunk = os.pread(src, min(CHUNK, end - start), start)
                if not chunk:
                    break
                self.room -= len(chunk)
                if self.room < 0:
                    raise _Full
                os.pwrite(out, chunk, start)
                start += len(chunk)
        os.ftruncate(out, size)


def _settle(fd: int, info: os.stat_result) -> None:
    """The copy at `fd` given its source's owner, permission bits (no setuid, setgid, sticky) and times."""
    os.fchown(fd, info.st_uid, info.st_gid)
    os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o777)
    os.utime(fd, ns=(info.st_atime_ns, info.st_mtime_ns))


def keep_workspaces_below(prefix: str) -> None:
    """Before a killed run's disks are unmounted (--keep_workspaces): each workspace bound on one becomes
    a plain folder holding its files. A workspace lies in the temporary folder itself and its path reaches a
    disk of the run: not a mount listed in a disk's folder, nor one below a host folder a root command mounted
    over it (its path reaches that folder, which is neither copied nor written into). Its copy, the disk's files
    alone, is moved into its path once nothing is mounted on or below that any more; else it stays beside it."""
    temporary = os.path.dirname(prefix)
    for point in sorted({point for point, _ in tmpfs.mounted_below(prefix) if os.path.dirname(point) == temporary}):
        try:
            device = os.lstat(point).st_dev
        except OSError:  # gone meanwhile, or below a mount over the temporary folder where it is not
            continue
        if not loops.of_run(device, prefix):
            continue
        copy = tempfile.mkdtemp(prefix=point + "-kept-")
        try:
            copy_files(point, copy, device, point)
            tmpfs.detach_below([point])
            for entry in os.listdir(copy):
                os.rename(os.path.join(copy, entry), os.path.join(point, entry))
            os.rmdir(copy)
        except OSError as exc:
            notes.append(f"--keep_workspaces: a killed sample's workspace {point} kept in {copy}: {exc}")


def give_back(disk: Disk, settings: EnvironmentSettings) -> None:
    """At the sample's end (its processes gone, its folders unmounted): emptied, and kept for the next with
    its reserve where that is whole; dropped when it cannot be emptied, whatever went wrong."""
    with contextlib.suppress(Exception):
        if disk.emptied():
            _free.setdefault((settings.run_tag, settings.limits.max_disk_mb), []).append(disk)
            return
    disk.drop()
