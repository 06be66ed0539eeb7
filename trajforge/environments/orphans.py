"""No process a prompt started outlives the prompt, on this machine too.

A command's process group dies with its time limit, but `setsid`, a double fork or `nohup cmd &` leave
processes that no group kill reaches. Where the sample has a cgroup (limits.SampleCgroup: root, or a
delegated v2 subtree), its member list is exactly its processes, and they are ended through it. Without
one (and without a PID namespace: that is bwrap), what works for a plain user on Linux is:

- the worker becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so orphans of a prompt's
  commands re-parent to the worker instead of init, and their zombies are ours to reap: every process
  a prompt started is among the worker's descendants (walked through /proc/PID/task/TID/children, so
  the cost is what this worker runs, never every process of the host);
- every command of a prompt carries a random token in its environment (PROMPT_MARKER), which children
  inherit and which `setsid` or a fork does not change; closing the prompt SIGKILLs every descendant
  whose /proc/PID/environ holds it, until none is left (a process forking in a loop is caught later).

A process that deliberately execs itself with a cleaned environment escapes the marker: `local` without
a cgroup cannot prevent that; bwrap (its PID namespace dies with each command), a cgroup and the
container backends can.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time

PROMPT_MARKER = "BATCH_RUNNER_PROMPT"
PR_SET_CHILD_SUBREAPER = 36
REAP_EVERY = 1.0  # seconds between two looks for zombies that ended by themselves, shared by the worker's prompts
EMPTY_SCANS = 3  # scans in a row that found nothing before a prompt counts as ended
KILL_PASSES = 50  # scans of /proc before giving up on a process that forks faster than we kill
# Direct children that run_process started and still waits for: asyncio reaps them, we must not.
commands_running: set[int] = set()
# Commands being started (another prompt's, on the loop thread while end_prompt runs on its own): a
# zombie may be one of them, exited before its pid reached commands_running. Reaping it then makes
# asyncio report exit 255 ("Unknown child process pid") for a command that succeeded.
starting: list[int] = []


@contextlib.contextmanager
def starting_command():
    starting.append(1)
    try:
        yield
    finally:
        starting.pop()


class _State:
    # The process that is a subreaper, whose commands' orphans are its descendants (no need to look at the
    # whole host). A pid, not a flag: a forked child inherits this but not the kernel's setting, so a
    # worker forked from a process that had opened an environment must ask for it again.
    subreaper = 0
    look: threading.Timer | None = None  # the next look for orphaned zombies, when one is due
    lock = threading.Lock()


def become_subreaper() -> bool:
    """Make orphans of this process's descendants re-parent to it; False where Linux does not allow it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # Orphans are then found through /proc/PID/task/TID/children, which some kernels lack
        # (CONFIG_PROC_CHILDREN): there the whole process table is read instead, never nothing.
        readable = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")
        if _State.subreaper != os.getpid() and readable and libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            _State.subreaper = os.getpid()
    except (OSError, AttributeError):
        pass
    return _State.subreaper == os.getpid()


def children(pid: int) -> list[int]:
    """The direct children of every thread of `pid` (a process forks from any of its threads)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone meanwhile
        return found
    for tid in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
            found += map(int, handle.read().split())
    return found


def descendants() -> list[int]:
    """Every process below this one: where the marked processes are once we are a subreaper. Without
    that (an old kernel), every process of the host."""
    if _State.subreaper != os.getpid():
        return _pids()
    found, below = [], [os.getpid()]
    while below:
        for child in children(below.pop()):
            found.append(child)
            below.append(child)
    return found


def marked(token: str) -> list[int]:
    """Pids of our descendants that carry `token`."""
    needle = f"{PROMPT_MARKER}={token}".encode()
    found = []
    for pid in descendants():
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(pid)
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def end_marked(token: str) -> int:
    """SIGKILL every process carrying `token` and reap those that are our children; how many were
    killed. Blocking (it reads /proc): call it on a thread."""
    killed: set[int] = set()
    # Done after scans in a row that found none: a process amid exec shows no environment for a moment
    # (the kernel sets the new one after it swapped the memory), so one empty scan can miss it.
    empty = 0
    for _ in range(KILL_PASSES):
        found = [pid for pid in marked(token) if pid != os.getpid()]
        empty = 0 if found else empty + 1
        if empty == EMPTY_SCANS:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(found)
        time.sleep(0.01)  # let the kernel deliver before the next scan
    reap(killed)
    return len(killed)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, session id) of a process, zombies included; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            # The command name (field 2) may hold spaces and parentheses: the fields after its last ')'.
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def reap(pids: set[int]) -> None:
    """Collect the zombies of the killed `pids` that re-parented to us (not asyncio's own children)."""
    me = os.getpid()
    waiting = {pid for pid in pids if pid not in commands_running and (_stat(pid) or ("", 0, 0))[1] == me}
    deadline = time.monotonic() + 2.0
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # already collected
                done = pid
            if done:
                waiting.discard(pid)
        if waiting:
            time.sleep(0.01)


def reap_exited_orphans() -> None:
    """Collect, REAP_EVERY seconds from now, zombies re-parented to us whose process ended by itself (a
    daemon that finished before its prompt did; bwrap's PID-namespace init, which outlives bwrap for a
    moment when the command left a process behind). One look at this worker's children on a timer
    thread, shared by every prompt closing meanwhile: a zombie holds nothing but its pid."""
    with _State.lock:
        if _State.look is None:
            _State.look = threading.Timer(REAP_EVERY, _collect_orphans)
            _State.look.daemon = True
            _State.look.start()


def _collect_orphans() -> None:
    """Only those outside our session: every command run_process starts leads a session of its own,
    while what else this process starts (the browser driver) stays in ours and is reaped by whoever
    started it."""
    with _State.lock:
        _State.look = None
    me, own_session = os.getpid(), os.getsid(0)
    for pid in children(me):
        stat = _stat(pid)
        if stat and stat[0] == "Z" and stat[1] == me and stat[2] != own_session and pid not in commands_running:
            if starting:  # it may be a command exited before its pid reached commands_running: later
                reap_exited_orphans()
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
