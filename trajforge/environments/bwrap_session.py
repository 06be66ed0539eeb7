"""One bwrap sandbox for all of a sample's agent commands: made at its first command, ended with the agent.

A sandbox costs its exec chain (the cgroup join, nsenter, bwrap: namespaces, thirty mounts, the seccomp
filter) about 8 ms of CPU; a command run inside one already made costs a fork and its own exec, about
1.3 ms (bench/command_chain.py). So bwrap starts once per sample with a small shell of its own, the
spawner (SPAWNER), as its command, and every agent command of the sample is a child of that shell,
with the sandbox's namespaces, uid, seccomp filter, cgroup and limits, which no child can shed.

The runner talks to the spawner through a control folder (`ctl`) of its own, bound read-only in the
sandbox at CONTROL: for command N it writes N.sh (its cwd, argv and redirections, quoted for sh) and
N.in (its input, when it has one), makes the FIFO N.out for its output, opened for reading first, and
writes N on the spawner's stdin. The spawner sources N.sh in a background subshell, waits for it and
prints `TOKEN N STATUS`. The output is read until the command exited and nothing holds the FIFO open any
more: a background process of it that keeps its output holds the command to its time limit, as in
local (run_process) and docker; one that redirected its output lives on.

What the agent can do to the spawner, a process of its own uid: end it, or write on its pipes through
/proc. Either changes the results of its own commands only (their output and exit status, which its
commands could print anyway): the runner reads at most a bounded line, within the command's time, and
a spawner that ends or misbehaves is a sandbox that ended (its processes with it); the next command
gets a new one. Nothing the runner trusts runs here once the agent has begun: the verification has
sandboxes of its own (a fresh bwrap per command, two uids), after this one and everything in it ended.

Unlike a sandbox per command, a process the agent leaves running (its output elsewhere) lives on into its
next commands (a server it started and then queries), until a command times out or the sample's agent
ends: a timeout ends the whole sandbox, and the next command starts in a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import signal
import time
from typing import NoReturn, cast

from trajforge.environments import ExecResult
from trajforge.environments.contract import Spawned, timeout_result
from trajforge.environments.local import OutputPipe, leads_its_group
from trajforge.environments.orphans import children, state
from trajforge.environments.trees import remove_tree
from trajforge.tail import CappedOutput

CONTROL = "/.batch-runner"  # where the control folder lies in the sandbox, read-only (no folder of the host)
LINE_LIMIT = 256  # bytes of a line on the spawner's stdout read at most: a status is a few dozen
NOISE = 4096  # bytes of what else the spawner said (bwrap's error: its stderr) kept for a sandbox that ended
PER_WAKE = 16 * 65536  # bytes of a command's output FIFO read at most per wake-up of the event loop
INLINE = 1 << 20  # bytes of a command's input written on the event loop at most (more: on a thread)
GRACE = 1.0  # seconds an idle sandbox whose spawner's stdin closed gets to end by itself
INIT_WAIT = 2.0  # seconds a killed sandbox's init gets to end its PID namespace
STDERR_WAIT = 1.0  # seconds an ended sandbox's stderr gets to say why
# The sandbox's own command. TOKEN is the runner's, per sandbox; a request is a number alone.
SPAWNER = """exec 2>&1
while IFS= read -r n; do
  case $n in "" | *[!0-9]*) exit 2 ;; esac
  ( . "{control}/$n.sh" ) &
  wait $!
  echo "{token} $n $?"
done"""


class _Ended(Exception):
    """The sandbox ended before it said the command's status."""


class Session:
    """A started sandbox (Spawned: the spawner's process and how to end its group) and its control folder."""

    def __init__(self, spawned: Spawned, control: str, token: str, owner: int | None, key: object):
        self.spawned = spawned
        self.control = control  # the host's path of the folder the sandbox sees at CONTROL
        self.token = token
        self.owner = owner  # the sandbox's host uid, to own the FIFOs it writes (None: the runner's)
        self.key = key  # what the sandbox was made with (the command variables): another asks for another one
        self.count = 0
        self.noise = b""
        self.ending: asyncio.Future | None = None  # its end, once begun

    @staticmethod
    def spawner(token: str) -> list[str]:
        return ["sh", "-c", SPAWNER.format(control=CONTROL, token=token)]

    async def run(self, argv: list[str], cwd: str, timeout: float, stdin: bytes | None, limit: int) -> ExecResult:
        """argv run in the sandbox from `cwd` with `stdin`, its output capped at `limit` bytes; one command at a
        time (the caller's lock: BwrapEnvironment.agent_turn). A sandbox that ended before it said the command's
        status (the command ended its spawner, or bwrap could not start) is ended for good: the result holds what
        the command wrote and why (exit status -1)."""
        self.count += 1
        number = str(self.count)
        output = CappedOutput(limit)
        if stdin is not None and len(stdin) > INLINE:  # a task's repository (write_files): off the event loop
            fifo = OutputPipe(output, await asyncio.to_thread(self._prepare, number, argv, cwd, stdin))
        else:
            fifo = OutputPipe(output, self._prepare(number, argv, cwd, stdin))
        fifo.started(PER_WAKE)  # a writer as fast as the runner never holds the event loop
        ended = False
        try:
            try:
                code = await asyncio.wait_for(self._finished(number, fifo), timeout)
            except TimeoutError:
                return timeout_result(output.text(), timeout)
            except (_Ended, OSError, ValueError) as exc:  # ValueError: a line past LINE_LIMIT
                said = str(exc) or self.said()
                return ExecResult(output.text(), -1, "the command's sandbox ended" + (f": {said}" if said else ""))
            ended = True
            return ExecResult(output.text(), code)
        finally:
            fifo.close()
            if not ended:  # timed out, cancelled or lost: the sandbox goes with what runs in it
                await self.end(graceful=False)
            _remove(*(os.path.join(self.control, number + suffix) for suffix in (".out", ".sh", ".in")))

    def _prepare(self, number: str, argv: list[str], cwd: str, stdin: bytes | None) -> int:
        """N.in, N.sh and the FIFO N.out written, the FIFO opened for reading (without waiting for its
        writer): its descriptor. The output is opened first: a cwd that is gone is said there."""
        source = "/dev/null"
        if stdin is not None:
            _write(os.path.join(self.control, number + ".in"), stdin)
            source = f"{CONTROL}/{number}.in"
        command = " ".join(shlex.quote(part) for part in argv)
        script = f"exec <{shlex.quote(source)} >{CONTROL}/{number}.out 2>&1\ncd -- {shlex.quote(cwd)} || exit 125\n"
        _write(os.path.join(self.control, number + ".sh"), f"{script}exec {command}\n".encode())
        fifo = os.path.join(self.control, number + ".out")
        os.mkfifo(fifo, 0o600)
        if self.owner is not None:
            os.chown(fifo, self.owner, self.owner)
        return os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)

    async def _finished(self, number: str, fifo: OutputPipe) -> int:
        """Command `number`'s exit status, once it exited and nothing holds its output open any more (what a
        background process of it that keeps the output holds the command to its time limit, as run_process).
        Its end of file is the kernel's only after a writer came: before, nothing to read is no end, and one
        that never opened it is none now."""
        code = await self._ask(number)
        if not (fifo.closed.done() or fifo.read(PER_WAKE)):
            await fifo.closed
        return code

    async def _ask(self, number: str) -> int:
        """Command `number` started; the exit status the spawner says for it. What else it says is kept as noise."""
        process = self.spawned.process
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(number.encode() + b"\n")
            await process.stdin.drain()
        except OSError:  # it is gone already
            await self._ended()
        while True:
            line = await process.stdout.readline()
            if not line:
                await self._ended()
            parts = line.split()
            if len(parts) == 3 and parts[0] == self.token.encode() and parts[1] == number.encode():
                with contextlib.suppress(ValueError):
                    return int(parts[2])
            self.noise = (self.noise + line)[-NOISE:]

    async def _ended(self) -> NoReturn:
        """_Ended, with why: bwrap's own error, when it could not make the sandbox, is on its stderr."""
        stderr = self.spawned.process.stderr
        if stderr is not None:
            with contextlib.suppress(TimeoutError, OSError, ValueError):
                self.noise += await asyncio.wait_for(stderr.read(NOISE), STDERR_WAIT)
        raise _Ended(self.said())

    def said(self) -> str:
        """What the sandbox said besides statuses (bwrap's error, when it could not start)."""
        return self.noise.decode(errors="replace").strip()

    async def end(self, graceful: bool = True) -> None:
        """The sandbox and every process in it ended, its control folder removed; once: every caller waits for
        the one ending. `graceful` (no command of it running): its spawner's stdin closed, it ends by itself,
        and bwrap after its PID namespace; else, or past GRACE, bwrap's group is killed, and what is waited
        for is the sandbox's init, whose end is its namespace's. A bwrap already collected is never signalled:
        its number, free again, may lead another process's group by then (another sample's command, a host
        process: review 28)."""
        if self.ending is None:
            self.ending = asyncio.ensure_future(self._end(graceful))
        await asyncio.shield(self.ending)

    @property
    def ended(self) -> bool:
        return self.ending is not None

    async def _end(self, graceful: bool) -> None:
        process = cast(asyncio.subprocess.Process, self.spawned.process)  # spawn_process's
        try:
            if graceful and process.returncode is None and process.stdin is not None:
                process.stdin.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(process.wait()), GRACE)
            if leads_its_group(process):  # not collected: its number is still its own, until the wait below
                init = next(iter(children(process.pid)), None)  # the sandbox's init: bwrap forks one
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
                await _exited(init)
        finally:
            await asyncio.to_thread(remove_tree, self.control)


async def _exited(pid: int | None) -> None:
    """Wait (at most INIT_WAIT seconds) until the sandbox's init `pid` has exited: killed as bwrap died
    (--die-with-parent), it first kills and waits for every process of its PID namespace. Only looked at,
    never signalled: collected meanwhile (orphans.py), its number may be another's."""
    deadline = time.monotonic() + INIT_WAIT
    while pid is not None and time.monotonic() < deadline and state(pid) not in (None, "Z", "X"):
        await asyncio.sleep(0.01)


def _write(path: str, data: bytes) -> None:
    """A new file of the runner's at `path`, readable by the sandbox (its folder is bound read-only)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _remove(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def new_token() -> str:
    return secrets.token_hex(8)
