"""No process a prompt started outlives the prompt, on this machine too.

A command's process group dies with its time limit, but `setsid`, a double fork or `nohup cmd &` leave
processes that no group kill reaches. Without systemd (no cgroup we may create) and without a PID
namespace (that is bwrap), what works for a plain user on Linux is:

- the worker becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so orphans of a prompt's
  commands re-parent to the worker instead of init, and their zombies are ours to reap;
- every command of a prompt carries a random token in its environment (PROMPT_MARKER), which children
  inherit and which `setsid` or a fork does not change; closing the prompt SIGKILLs every process whose
  /proc/PID/environ holds it, until none is left (a process forking in a loop is caught on a later pass).

A process that deliberately execs itself with a cleaned environment escapes the marker: `local` cannot
prevent that, bwrap (its PID namespace dies with each command) and the container backends can.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

PROMPT_MARKER = "BATCH_RUNNER_PROMPT"
PR_SET_CHILD_SUBREAPER = 36
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


def become_subreaper() -> bool:
    """Make orphans of this process's descendants re-parent to it; False where Linux does not allow it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def marked(token: str) -> list[int]:
    """Pids of the processes (of this user: others' environ cannot be read) that carry `token`."""
    needle = f"{PROMPT_MARKER}={token}".encode()
    found = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(pid)
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def end_prompt(token: str) -> int:
    """SIGKILL every process carrying `token`, reap those that are our children and any orphan that
    ended by itself; how many were killed. Blocking (it reads /proc): call it on a thread."""
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
    reap_exited_orphans()
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
    """Collect zombies re-parented to us whose process ended by itself (a daemon that finished before
    its prompt did). Only those outside our session: every command run_process starts leads a session
    of its own, while what else this process starts (the browser driver) stays in ours and is reaped
    by whoever started it."""
    me, own_session = os.getpid(), os.getsid(0)
    for pid in _pids():
        stat = _stat(pid)
        if stat and stat[0] == "Z" and stat[1] == me and stat[2] != own_session and pid not in commands_running:
            if starting:  # left for the next prompt's end to collect
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
