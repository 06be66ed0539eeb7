"""A namespace kept by a holder process (the slot's mount namespace, a sample's network): the step of a
command's exec chain that enters it by the descriptor the worker keeps open, and the holder's end."""

from __future__ import annotations

import os
import shutil
import subprocess

END_GRACE = 5.0  # seconds a holder has to exit once its stdin is closed


def nsenter(kind: str, fd: int) -> list[str]:
    """The exec step that joins the namespace this process keeps open at `fd` (`kind`: nsenter's option,
    "mount" or "net"), for a command this process spawns and waits on. nsenter opens the descriptor through
    this process's /proc (its parent's, alive while it waits: no reused pid), so `fd` stays close-on-exec
    and is never passed on: no command inherits a namespace's descriptor. Where this process is gone,
    nsenter finds none and the command does not run."""
    return [shutil.which("nsenter") or "nsenter", f"--{kind}=/proc/{os.getpid()}/fd/{fd}", "--"]


def end(holder: subprocess.Popen) -> None:
    """Close the holder's pipes (closing its stdin ends it) and reap it, killed after END_GRACE. Blocking."""
    for stream in (holder.stdin, holder.stdout):
        if stream:
            stream.close()
    try:
        holder.wait(END_GRACE)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
