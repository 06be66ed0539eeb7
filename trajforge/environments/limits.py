"""Limits on what one sample's commands may take: processes, memory and the size of any one file.

Each mechanism is what works for every uid and every runtime:

- the file size is an rlimit (RLIMIT_FSIZE) set in the command's process before it runs (`ulimit -f`),
  inherited by all it starts: a write past it fails (SIGXFSZ, "File size limit exceeded"); the runner
  is never bound;
- processes and memory are a cgroup per sample (v2 `pids.max`/`memory.max`, else v1 `pids` and `memory`)
  that every command of the sample joins before it runs (its shell writes cgroup.procs: confined()).
  Not rlimits: RLIMIT_NPROC counts every process of a uid, so it is not per sample (and never binds
  root), and RLIMIT_AS breaks runtimes that reserve address space (the JVM, Go, V8). Hitting them is an
  ordinary error of that command (fork fails, or the kernel's OOM killer ends it: exit 137); the run
  goes on. Where no cgroup can be made (not root, no
  delegated v2 subtree), the run says at start that these are not enforced.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import shlex
import time
import uuid
from dataclasses import dataclass, fields

from trajforge.environments.programs import program
from trajforge.flags import default

MB = 1024 * 1024
V2 = "/sys/fs/cgroup"
RUNNER, OWN, NONE = "runner", "own", "none"  # who enforces a backend's limits (its Backend.LIMITS)
NOBODY = 65534
# Printed by a command whose process could not join the sample's cgroup (removed by hand meanwhile).
JOIN_FAILED = "{ echo 'cannot join the sample cgroup: the command does not run' >&2; exit 125; }"
# util-linux: joins a command's namespaces and drops a root runner's bwrap commands to nobody (confined)
NSENTER = program("nsenter")
PR_GET_SECUREBITS, SECBIT_NO_SETUID_FIXUP = 27, 1 << 2
V1 = {"pids": "/sys/fs/cgroup/pids", "memory": "/sys/fs/cgroup/memory"}


@dataclass(frozen=True)
class Limits:  # 0 for none
    max_processes: int = default("max_processes")
    max_memory_mb: int = default("max_memory_mb")
    max_file_size_mb: int = default("max_file_size_mb")
    max_disk_mb: int = default("max_disk_mb")  # enforced by disk.py, not here


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path in a v1 hierarchy of `controller` ("" on v2: the `0::` line)."""
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as handle:
        for line in handle:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                return path
    return ""


@functools.cache  # a process's cgroup stays where it is: read once, not per sample
def _v2_parent() -> str | None:
    """Our v2 cgroup when it may hold children with pids and memory limits (root, or a delegated subtree)."""
    path = V2 + _own_cgroup("")
    try:
        with open(os.path.join(V2, "cgroup.controllers")) as handle:
            available = handle.read().split()
    except OSError:
        return None
    if {"pids", "memory"} <= set(available) and os.access(path, os.W_OK):
        return path
    return None


@functools.cache
def _v1_parents() -> dict[str, str] | None:
    parents = {name: root + _own_cgroup(name) for name, root in V1.items()}
    return parents if all(os.path.isdir(p) and os.access(p, os.W_OK) for p in parents.values()) else None


def unenforced(limits: Limits, kind: str, enforcer: str) -> str | None:
    """The warning to print once when a limit cannot be enforced by the `kind` of environment here, whose
    limits `enforcer` enforces (its Backend.LIMITS); --max_disk_mb's: disk.unenforced."""
    asked = [f"--{item.name}" for item in fields(limits) if getattr(limits, item.name) and item.name != "max_disk_mb"]
    if enforcer == OWN:  # the container's own limits
        return None
    if enforcer != RUNNER:
        wanted = asked
    elif _v2_parent() or _v1_parents():
        wanted = []
    else:
        wanted = [name for name in asked if name != "--max_file_size_mb"]  # an rlimit: it holds
    how = "no cgroup can be made here (run as root, or in a delegated cgroup v2 subtree)" if enforcer == RUNNER else ""
    said = [f"{' and '.join(wanted)} not enforced by --environment={kind}" + (f": {how}" if how else "")]
    # bwrap's /tmp is a tmpfs of --max_file_size_mb only where the host's root mounts it (tmpfs.py).
    if kind == "bwrap" and limits.max_file_size_mb and host_user() is None:
        said.append("the size of bwrap's /tmp (--max_file_size_mb) is not enforced: its tmpfs needs the host's root")
    return "; ".join(said[0 if wanted else 1 :]) or None


class SampleCgroup:
    """One sample's cgroup(s); made by make(), which says whether it could; removed by remove()."""

    def __init__(self, limits: Limits, prefix: str):
        self.limits = limits
        self.prefix = prefix  # the run's: remove_leftovers finds what a killed run left
        self.paths: list[str] = []

    def make(self) -> bool:
        if not (self.limits.max_processes or self.limits.max_memory_mb):
            return False
        name = f"{self.prefix}{uuid.uuid4().hex[:12]}"
        try:
            if (parent := _v2_parent()) is not None:
                self._made(os.path.join(parent, name), {"pids.max": self._pids(), "memory.max": self._memory()})
            elif (parents := _v1_parents()) is not None:
                self._made(os.path.join(parents["pids"], name), {"pids.max": self._pids()})
                self._made(os.path.join(parents["memory"], name), {"memory.limit_in_bytes": self._memory()})
            return bool(self.paths)
        except OSError:  # a controller that refuses: no limit rather than no sample
            self.remove()
            return False

    def _pids(self) -> str:
        return str(self.limits.max_processes) if self.limits.max_processes else "max"

    def _memory(self) -> str:
        return str(self.limits.max_memory_mb * MB) if self.limits.max_memory_mb else "max"

    def _made(self, path: str, values: dict[str, str]) -> None:
        os.mkdir(path)
        self.paths.append(path)
        for key, value in values.items():
            if value == "max" and key.endswith("in_bytes"):
                value = "-1"
            with open(os.path.join(path, key), "w") as handle:
                handle.write(value)

    @classmethod
    def remove_leftovers(cls, prefix: str) -> None:
        """The cgroups a killed run (named by `prefix`) left, with what is still in them."""
        parents = [_v2_parent(), *(_v1_parents() or {}).values()]
        cgroup = cls(Limits(), prefix)
        cgroup.paths = [
            p
            for parent in parents
            if parent
            for p in glob.glob(os.path.join(glob.escape(parent), glob.escape(prefix) + "*"))
        ]
        cgroup.remove()

    def kill(self) -> set[int]:
        """Kill what is in it until it is empty (also a process that left the prompt's marker behind:
        `env -i`); the pids killed, for their reaping. One read of cgroup.procs when it is empty. Blocking."""
        killed: set[int] = set()
        for path in self.paths:
            with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.kill"), "w") as handle:
                handle.write("1")  # v2 (Linux 5.14+): all at once, also what forks meanwhile
            for _ in range(50):
                if not (members := _kill_members(path)):
                    break
                killed.update(members)
        return killed

    def remove(self) -> None:
        """Kill what is still in it, then remove it. Blocking: call it on a thread."""
        for path in self.paths:
            for _ in range(50):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
                    break
                _kill_members(path)
        self.paths = []


def _members(path: str) -> list[int]:
    """The live processes in the cgroup (a zombie is not listed: it left when it exited)."""
    try:
        with open(os.path.join(path, "cgroup.procs")) as handle:
            return [int(pid) for pid in handle.read().split()]
    except OSError:
        return []


def _kill_members(path: str) -> list[int]:
    members = _members(path)
    for pid in members:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    if members:
        time.sleep(0.01)  # SIGKILL takes effect when each runs next
    return members


@functools.cache
def host_user() -> int | None:
    """The host uid a root runner's sandboxed commands run as (nobody), None where there is none to
    drop to: a runner that is not root, or root of a user namespace where only it is mapped (`unshare
    -r`), which is no one's root on the host."""
    return NOBODY if os.geteuid() == 0 and mapped(NOBODY) else None


def drop_problem() -> str | None:
    """Why a root runner's drop to nobody (nsenter's --setgid/--setuid in confined) would not leave a command
    without its groups and capabilities, else None. nsenter goes on when setgroups() fails outside a user
    namespace it joins, as in one whose /proc/self/setgroups is "deny" (a rootless or userns-remapped
    container): the runner's supplementary groups would stay. With SECBIT_NO_SETUID_FIXUP, setuid clears no
    capability (bwrap then refuses to run every command)."""
    try:
        with open("/proc/self/setgroups") as handle:
            denied = handle.read().strip() == "deny"
    except OSError:
        denied = False
    groups = os.getgroups()
    if denied and groups:
        return (
            f"it holds supplementary groups ({' '.join(map(str, groups))}) that its user namespace does "
            "not let it drop (/proc/self/setgroups is deny), which its commands would keep: start it without them"
        )
    if ctypes.CDLL(None, use_errno=True).prctl(PR_GET_SECUREBITS, 0, 0, 0, 0) & SECBIT_NO_SETUID_FIXUP:
        return "its securebits keep capabilities across setuid (no_setuid_fixup): start it without them"
    return None


def mapped(uid: int) -> bool:
    """Whether `uid` exists in this process's user namespace."""
    try:
        with open("/proc/self/uid_map") as handle:
            ranges = [tuple(map(int, line.split())) for line in handle if line.strip()]
    except OSError:
        return True
    return any(inside <= uid < inside + count for inside, _, count in ranges)


def confined(
    argv: list[str],
    limits: Limits,
    cgroups: list[str],
    uid: int | None = None,
    joins: tuple[str, ...] = (),
    opens: tuple[tuple[int, int], ...] = (),
) -> list[str]:
    """argv behind the steps its own process takes before it runs: join the sample's cgroups, take the
    file size rlimit, open each descriptor `fd` this process keeps open (close-on-exec) at `at` (below 10)
    for argv, for each (at, fd) of `opens` (through this process's /proc, as nsenter joins: holder.join),
    then one nsenter that joins the namespaces of `joins` (its options: holder.join, the slot's mount
    namespace and the sample's network) as root and, with `uid`, becomes that user (no supplementary
    group, that gid, that uid: setgroups, setgid, setuid). The steps are in the exec
    chain of the spawned process, never a preexec_fn: one of those makes CPython fork() the whole (big,
    threaded) worker for every command instead of vfork()ing it. A command that cannot join its cgroup
    does not run (exit 125): out of it, nothing would bound or end it.

    After the drop, the process holds no capability (setuid from root to a uid that is not 0 clears the
    permitted, effective and ambient sets) and execs only bwrap, which is neither setuid nor file-capable
    here: nothing of the agent runs before bwrap's own sandbox has set no_new_privs, emptied the
    inheritable set and the bounding set, and loaded the seccomp filter (test_unprivileged checks each
    in a command's /proc status)."""
    steps = [f"{{ echo 0 >{shlex.quote(path)}/cgroup.procs; }} 2>/dev/null || {JOIN_FAILED}" for path in cgroups]
    if limits.max_file_size_mb:  # in 512-byte blocks: POSIX sh (dash, bash as sh, busybox)
        steps.append(f"ulimit -f {limits.max_file_size_mb * MB // 512}")
    steps += [f"exec {at}</proc/{os.getpid()}/fd/{fd}" for at, fd in opens]  # dash: one digit
    if uid is not None:  # nsenter clears the supplementary groups with --setgid
        joins = (*joins, f"--setgid={uid}", f"--setuid={uid}")
    if joins:
        argv = [NSENTER, *joins, "--", *argv]
    if not steps:
        return argv
    if argv[:2] == ["sh", "-c"] and len(argv) > 2:  # the command's own shell takes them: no second exec
        return ["sh", "-c", "; ".join([*steps, argv[2]]), *argv[3:]]  # one line: its line numbers stay
    return ["/bin/sh", "-c", "; ".join([*steps, 'exec "$@"']), "sh", *argv]  # not looked up in PATH
