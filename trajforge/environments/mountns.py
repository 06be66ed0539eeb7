"""The mount namespace a bwrap command starts from, one per disk slot (disk.py): the system's folders,
/proc, /dev and the slot's disk, nothing else of the host.

bwrap copies the mount namespace it is started in, reads the whole mount table (/proc/self/mountinfo)
at each of its binds (a dozen per command) and detaches the copy of the host's tree at the end of its
setup. Started in the host's namespace, every command paid for every mount of the machine: the other
samples' disks and workspaces among them, hundreds with 200 samples in flight, and those of whatever
else runs there. Started in this one, it pays for a dozen.

The namespace is made once per slot, when bwrap first needs it, by a holder: bwrap run as the runner
(root) with no namespace of its own but the mount namespace, binding these folders at their own paths
(copies of the host's at that moment: with the host's / private, what the host mounts or unmounts below
them later is not seen there; nothing relies on it, as a slot's disk is bound before and the holder ends
before the disk is unmounted), and a shell that waits on its stdin. No command runs in it as it is:
each enters it by a descriptor the worker keeps (`nsenter --mount=/proc/<worker>/fd/N` in its own exec
chain, after it joined its cgroup and before it drops to nobody; the descriptor is close-on-exec: no
command holds it) only to start its own bwrap there, which builds the sandbox from these folders as it
would from the host's. The holder ends when its stdin closes: with the slot, or with the worker."""

from __future__ import annotations

import os
import select
import subprocess

from trajforge.environments import holder, programs

START_TIMEOUT = 30
# The holder says its pid as the host's /proc sees it (bwrap gives it no PID namespace) and waits.
HOLDER = ["sh", "-c", "read pid rest </proc/self/stat; echo $pid; read line"]


def holder_argv(system: tuple[str, ...], folders: list[str]) -> list[str]:
    """bwrap's arguments for a holder: `system` (bwrap's own mounts of the system's folders), the host's
    /proc and /dev (with what is mounted below them: a command's bwrap mounts a fresh /proc only where
    one is wholly visible), and each of `folders` at its path, its parents passable by any uid."""
    argv = [programs.bwrap(), *system, "--bind", "/proc", "/proc", "--dev-bind", "/dev", "/dev"]
    made: set[str] = set()
    for folder in folders:
        parent, parents = os.path.dirname(folder), []
        while parent not in ("/", "") and parent not in made:
            parents.append(parent)
            parent = os.path.dirname(parent)
        for path in reversed(parents):  # bwrap would make them 0700: the sandbox's uid passes through
            argv += ["--perms", "0711", "--dir", path]
            made.add(path)
        argv += ["--bind", folder, folder]
    return [*argv, "--", *HOLDER]


class SlotMounts(holder.Entered):
    """A slot's mount namespace: made by open(), entered through join(), gone with close()."""

    KIND = "mount"

    def __init__(self, argv: list[str]):
        super().__init__()
        self.argv = argv  # holder_argv's
        self.holder: subprocess.Popen | None = None

    def open(self) -> SlotMounts:
        """Start the holder; OSError when the namespace cannot be made. Blocking."""
        self.holder = holder.start(self.argv, subprocess.DEVNULL)
        try:
            assert self.holder.stdout is not None
            ready, _, _ = select.select([self.holder.stdout], [], [], START_TIMEOUT)
            line = self.holder.stdout.readline() if ready else b""
            if not line.strip().isdigit():
                raise OSError("bwrap could not make the slot's mount namespace")
            self.fd = holder.namespace(self.holder, f"/proc/{int(line)}/ns/mnt")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """End the holder (closing its stdin ends it). Blocking."""
        self.fd = None  # closed with its holder
        if self.holder is not None:
            holder.end(self.holder)
            self.holder = None
