"""A command's first process, whose number names its process group, watched through a pidfd and collected only
once the runner is done with its group (review 29).

asyncio collected it the moment it exited. A command whose shell exited while a background child it had moved to
a session of its own (`setsid`) kept the output open then ran into its limit, and the end of its group (SIGTERM,
SIGKILL, a wait for its processes) went by a number free since: another process's group may lead with it by then,
another sample's command (collected here, so that it said exit 255) or, the runner being root, any process of the
host. The leader's zombie holds its number (the kernel gives no new process a pid whose process is not collected),
so the group's number is its own until `collect`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time

from trajforge.environments.orphans import children, commands_running, group_of

LOOK_EVERY = 0.05  # seconds between two looks at a leader that exited, where the kernel has no pidfd (before 5.3)
SETTLING = 0.01  # seconds between two looks at a group being ended


class Leader:
    """`popen`'s process, started here in a group of its own: `exited` is its status (as asyncio gives one: the
    negative signal number when a signal ended it) as soon as it exits; it stays a zombie until `collect`."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid
        self.loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[int] = self.loop.create_future()
        self.later: asyncio.TimerHandle | None = None  # the next look, where it is looked at on a timer
        try:
            self.fd = os.pidfd_open(self.pid)
        except OSError:  # an old kernel: looked at every LOOK_EVERY seconds instead
            self.fd = -1
            self.later = self.loop.call_later(LOOK_EVERY, self._look)
        else:
            self.loop.add_reader(self.fd, self._look)

    async def wait(self) -> int:
        """Its status once it exited (the future itself is never cancelled with the one waiting for it)."""
        return await asyncio.shield(self.exited)

    def _look(self) -> None:
        self.later = None
        if self.fd >= 0:  # readable once it exited, or looked at on a timer from now on (the traced case below)
            self.loop.remove_reader(self.fd)
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # collected by someone else (nothing here does): its status is lost
            info, code = None, 255
        else:
            if info is None:  # still running, or exited but traced: its tracer must take its report first, and
                # its pidfd, readable since its exit, would call this again at every turn of the loop (review 31)
                self.later = self.loop.call_later(LOOK_EVERY, self._look)
                return
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        if not self.exited.done():
            self.exited.set_result(code)

    def collect(self) -> None:
        """Its zombie collected, so its number is free from now on (killed first, in case it still runs: an end
        that failed midway), and forgotten by orphans.commands_running in the same step, before another command
        can start with the number. Also on a cancelled sample."""
        try:
            if not self.exited.done():
                self._kill()
            try:
                _, status = os.waitpid(self.pid, 0)
                self.popen.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.popen.returncode = 255
        finally:
            commands_running.pop(self.pid, None)
            if self.later is not None:  # no look at a number that may be another process's from now on
                self.later.cancel()
                self.later = None
            if self.fd >= 0:
                self.loop.remove_reader(self.fd)
                os.close(self.fd)
                self.fd = -1

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.fd >= 0:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            else:  # not collected yet: the number is still its own
                os.kill(self.pid, signal.SIGKILL)


async def end_group(leader: Leader, grace: float) -> None:
    """Every process of the leader's group ended: SIGTERM, then SIGKILL to those still there after `grace`; then
    its former members that re-parented to this worker (a subreaper) collected, once they are zombies, so that
    the command has really ended. By the group's number, which the leader's zombie holds throughout."""
    number = leader.pid
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(number, signal.SIGTERM)
        await _gone(leader, grace)
    finally:  # also when the sample is cancelled during the grace
        with contextlib.suppress(ProcessLookupError):
            os.killpg(number, signal.SIGKILL)
    await leader.wait()
    await _gone(leader, 1.0)


async def _gone(leader: Leader, within: float) -> None:
    """Wait (at most `within` seconds) until the leader has exited and no other process of its group is a child of
    this worker, collecting those that are zombies. Only once the leader has exited do its group's other processes
    re-parent here; one that leaves a process of the group behind it as it ends hands it on to this worker too."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if leader.exited.done() and not _collect_members(leader.pid):
            return
        await asyncio.sleep(SETTLING)


def _collect_members(number: int) -> bool:
    """Collect this worker's children in group `number` (but its leader) that are zombies; whether any still runs."""
    running = False
    for pid in children(os.getpid()):
        if pid == number:
            continue
        found = group_of(pid)
        if found is None or found[1] != number:
            continue
        if found[0] != "Z":
            running = True
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return running
