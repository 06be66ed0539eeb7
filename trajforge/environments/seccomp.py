"""The seccomp filter every sandboxed command runs under (bwrap: a compiled BPF program given with
`--seccomp FD`; docker: the same list as a profile). It denies, with EPERM, each way one process takes
another's memory or file descriptors: tracing it, reading or writing its memory, duplicating its
descriptors, comparing them, steering its pages. A hidden test that runs the model's code in a child
can then trust its own stdout (the reward channel) and its own memory, whatever the host's Yama
setting (none on many hosts: same-uid tracing allowed). io_uring goes too: its operations are never
seen by seccomp at all; so do the kernel's keyrings (they outlive a sample) and a user namespace of a
command's own (root there, with every capability in it). `local` gets none: it is no sandbox.

The filter is built once per process with libseccomp (pyseccomp, ctypes over libseccomp.so.2): it knows
each architecture's numbers and kills a call made through another ABI (int 0x80, x32), which a
hand-written program would have to."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
from collections.abc import Iterator

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "process_madvise",
    "move_pages",
    "migrate_pages",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # The kernel's keyrings outlive a sample: every command possesses the runner's session keyring (inherited
    # across nsenter, bwrap and the drop to the sandbox's uid; systemd gives each service one), which a later
    # sample would read, and /proc/keys lists the keys of the sandbox's host uid, every sample's (review 16).
    "keyctl",
    "add_key",
    "request_key",
)
CLONE_NEWUSER = 0x10000000  # clone's and unshare's first argument; clone3 passes flags in memory: ENOSYS
# Docker's own default profile goes when a profile is given: what it refused without a capability and
# a sandbox should not do either (a user namespace of its own would hand back every capability in it).
DOCKER_ALSO = ("bpf", "userfaultfd", "setns")


@functools.cache
def bpf() -> bytes:
    """The compiled filter for this machine's architecture; OSError when libseccomp is missing."""
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:  # the package, or libseccomp.so.2 under it
        raise OSError(f"cannot build the seccomp filter (libseccomp2 and pyseccomp): {exc}") from None
    rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED:
        with contextlib.suppress(ValueError, RuntimeError):  # a call this libseccomp does not know
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    # No user namespace of a command's own, as in the docker profile: in one it holds every capability
    # (mounts over the read-only system, raw sockets), with every kernel bug that exposes.
    new_user = pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    for name in ("clone", "unshare"):
        rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name, new_user)
    with contextlib.suppress(ValueError, RuntimeError):
        rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb") as handle:  # a few hundred bytes: the pipe's buffer holds them
            rules.export_bpf(handle)
        return _read_all(read)
    finally:
        os.close(read)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


# The lowest descriptor the filter is passed at: a command's chain opens its own at 3-9 (limits.confined: the
# two-uid namespace at userns.OPENED_AT), over the filter's where it lay there (bwrap then read the namespace).
PASSED_FROM = 10


@contextlib.contextmanager
def filter_fd() -> Iterator[int]:
    """A descriptor to read the filter from, for one bwrap (which reads it to its end): a pipe of its own
    per command, so commands started at once never share a read offset; at PASSED_FROM or above."""
    read, write = os.pipe()
    try:
        try:
            os.write(write, bpf())
        finally:
            os.close(write)
        if read < PASSED_FROM:  # a worker with few open (the environment API in a small program of its own)
            low, read = read, fcntl.fcntl(read, fcntl.F_DUPFD_CLOEXEC, PASSED_FROM)
            os.close(low)
        yield read
    finally:
        os.close(read)


@functools.cache
def docker_profile() -> str:
    """The same denials as a Docker seccomp profile (JSON text, as the engine's API takes it)."""
    deny = {"names": [*DENIED, *DOCKER_ALSO], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    new_user = {"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER, "op": "SCMP_CMP_MASKED_EQ"}
    namespaces = {"names": ["clone", "unshare"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}
    # clone3 passes its flags in memory, where no filter can look: ENOSYS makes libc fall back to clone.
    clone3 = {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS}
    syscalls = [deny, {**namespaces, "args": [new_user]}, clone3]
    return json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": syscalls})
