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
EMPTY_SCANS = 3  # scans in a row that found nothing before a prompt counts as ended (or one sure scan)
KILL_PASSES = 50  # scans of /proc before giving up on a process that forks faster than we kill
# Direct children that run_process and spawn_process started and have not collected yet (asyncio, or their
# Leader): none but they may. Each with the prompt's marker its command carries ("" for none). Never a number
# collected since: another process may have it, which descendants() would leave out (local._Collected).
commands_running: dict[int, str] = {}
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
    return _children(pid)[0]


def _children(pid: int) -> tuple[list[int], bool]:
    """children(), and whether each of its threads' lists was read (a thread that ended meanwhile left
    its children to another, maybe one read before)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone meanwhile
        return found, False
    whole = True
    for tid in tasks:
        try:
            found += map(int, _read(f"/proc/{pid}/task/{tid}/children").split())
        except OSError:
            whole = False
    return found, whole


def descendants(token: str) -> tuple[list[int], bool]:
    """Every process below this one where the processes marked with `token` may be, once we are a
    subreaper; and whether the walk read every list it met. Without a subreaper (an old kernel), every
    process of the host, never a whole walk. What runs of another prompt's commands is left out: a
    prompt's processes descend from its own commands, or, once their parent ended, from this process
    itself. Every prompt closing walked every other prompt's commands too, and found one of them amid exec
    (or a zombie) often enough to walk three times: O(prompts in flight) reads of /proc a prompt."""
    me = os.getpid()
    if _State.subreaper != me:
        return _pids(), False
    found, below, whole = [], [me], True
    while below:
        parent = below.pop()
        listed, read = _children(parent)
        whole = whole and read
        for child in listed:
            if parent == me and commands_running.get(child, token) != token:
                continue
            found.append(child)
            below.append(child)
    return found, whole


def marked(token: str) -> tuple[list[int], bool]:
    """Pids of our descendants that carry `token`, and whether the scan is sure: the walk read every
    list, and every descendant listed was still there and showed an environment. One amid exec shows
    none for a moment (the kernel sets the new one after it swapped the memory), as do one that dropped
    every variable (`env -i`) and one we may not read; and one that ended meanwhile (or a zombie) may
    have left children that re-parented to this process after its own children were listed, which the
    walk missed."""
    needle = f"{PROMPT_MARKER}={token}".encode()
    below, sure = descendants(token)
    found = []
    for pid in below:
        try:
            environ = _read(f"/proc/{pid}/environ")
        except OSError:  # gone (or a zombie: ESRCH), or not ours to read
            sure = False
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
        elif not environ:
            sure = False
    return found, sure


def _read(path: str) -> bytes:
    """The whole file, without Python's buffered file object (a scan reads one a descendant)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def end_marked(token: str) -> int:
    """SIGKILL every process carrying `token` and reap those that are our children; how many were
    killed. Blocking (it reads /proc): call it on a thread."""
    killed: set[int] = set()
    # Done after a sure scan that found none (the usual end: the sample's cgroup ended its processes, or
    # none was left), else after EMPTY_SCANS in a row that found none: a process amid exec or re-parented
    # during a scan can be missed by one.
    empty = 0
    for _ in range(KILL_PASSES):
        marks, sure = marked(token)
        found = [pid for pid in marks if pid != os.getpid()]
        empty = 0 if found else empty + 1
        if empty == EMPTY_SCANS or (sure and not found):
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(found)
        time.sleep(0.01)  # let the kernel deliver before the next scan
    reap(killed)
    return len(killed)


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent pid, process group, session id) of a process, zombies included; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            # The command name (field 2) may hold spaces and parentheses: the fields after its last ')'.
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def group_of(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a process, zombies included; None when it is gone."""
    found = _stat(pid)
    return (found[0], found[2]) if found else None


def state(pid: int) -> str | None:
    """A process's state letter (`Z` for a zombie), or None when it is gone."""
    found = _stat(pid)
    return found[0] if found else None


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def reap(pids: set[int]) -> None:
    """Collect the zombies of the killed `pids` that re-parented to us (not asyncio's own children)."""
    me = os.getpid()
    waiting = {pid for pid in pids if pid not in commands_running and (_stat(pid) or ("", 0, 0, 0))[1] == me}
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
    me, own_session, later = os.getpid(), os.getsid(0), False
    for pid in children(me):
        stat = _stat(pid)
        if stat and stat[0] == "Z" and stat[1] == me and stat[3] != own_session and pid not in commands_running:
            # While a command starts, a zombie may be one that exited before its pid reached commands_running:
            # left for a later look, unless it was a PID namespace's init (bwrap's), which no command of ours is.
            if starting and not _namespace_init(pid):
                later = True
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    if later:
        reap_exited_orphans()


def _namespace_init(pid: int) -> bool:
    """Whether `pid` has a pid of its own in a PID namespace below ours too (its status's NSpid lists two)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"NSpid:"):
                    return len(line.split()) > 2
    except OSError:
        pass
    return False
