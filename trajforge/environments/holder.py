"""A namespace kept by a holder process (the slot's mount namespace, a sample's network): the holder's
start, the step of a command's exec chain that enters the namespace by the descriptor the worker keeps
open, and the holder's end.

A holder ends when its stdin closes: when its process ends it, or dies (even by SIGKILL: the kernel
closes the pipe). No other process may hold that pipe or the namespace's descriptor, so a process
forked from this one (a worker from the driver that listed the MCP servers, a worker's browser service)
closes them first thing (os.register_at_fork): else a holder and its namespace, with the slot's disk
mounted in it, would live as long as the longest-lived of them, past a killed driver."""

from __future__ import annotations

import os
import subprocess

END_GRACE = 5.0  # seconds a holder has to exit once its stdin is closed
_held: dict[subprocess.Popen, list[int]] = {}  # this process's holders, each with its namespaces' descriptors


def start(argv: list[str], stderr) -> subprocess.Popen:
    """A holder of this process: argv with its stdin and stdout piped to us."""
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
    _held[process] = []
    return process


def namespace(holder: subprocess.Popen, path: str) -> int:
    """The namespace at `path` (/proc/PID/ns/KIND of `holder`'s process) kept open, close-on-exec; closed
    with the holder's end."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    _held[holder].append(fd)
    return fd


def join(kind: str, fd: int) -> str:
    """nsenter's option (limits.confined) that joins the namespace this process keeps open at `fd` (`kind`:
    "mount" or "net"), for a command this process spawns and waits on. nsenter opens the descriptor through
    this process's /proc (its parent's, alive while it waits: no reused pid), so `fd` stays close-on-exec
    and is never passed on: no command inherits a namespace's descriptor. Where this process is gone,
    nsenter finds none and the command does not run."""
    return f"--{kind}=/proc/{os.getpid()}/fd/{fd}"


class Entered:
    """A namespace this process keeps open at `fd` (close-on-exec), which a command's exec chain enters."""

    KIND = ""  # nsenter's option for it: "mount" or "net"

    def __init__(self) -> None:
        self.fd: int | None = None

    def join(self) -> str:
        """nsenter's option that enters the namespace in a command's exec chain (join: nothing to pass on)."""
        assert self.fd is not None, f"{type(self).__name__}: the namespace is not open"
        return join(self.KIND, self.fd)


def end(holder: subprocess.Popen) -> None:
    """Close the namespaces' descriptors and the holder's pipes (closing its stdin ends it) and reap it,
    killed after END_GRACE. Blocking."""
    _close(holder, _held.pop(holder, []))
    try:
        holder.wait(END_GRACE)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()


def _let_go() -> None:
    """In a forked child: the parent's holders are the parent's alone (the child neither ends nor reaps them)."""
    for holder, fds in _held.items():
        _close(holder, fds)
        holder.returncode = 0  # not ours to wait for
    _held.clear()


def _close(holder: subprocess.Popen, fds: list[int]) -> None:
    """This process's hold on `holder`: its namespaces' descriptors and its pipes (closing its stdin ends it)."""
    for fd in fds:
        os.close(fd)
    for stream in (holder.stdin, holder.stdout):
        if stream:
            stream.close()


os.register_at_fork(after_in_child=_let_go)
