"""A namespace kept by a holder process (the slot's mount namespace, a sample's network): the step of a
command's exec chain that enters it by the descriptor the worker keeps open, and the holder's end."""

from __future__ import annotations

import shutil
import subprocess

END_GRACE = 5.0  # seconds a holder has to exit once its stdin is closed


def nsenter(kind: str, fd: int) -> list[str]:
    """The exec step that joins the namespace open at `fd` (`kind`: nsenter's option, "mount" or "net");
    the descriptor must be passed on to it."""
    return [shutil.which("nsenter") or "nsenter", f"--{kind}=/proc/self/fd/{fd}", "--"]


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
