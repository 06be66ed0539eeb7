"""The programs the runner execs by name (bwrap, nsenter, setpriv, pasta, mkfs.ext4), found on PATH
once each, as absolute paths.

A relative folder of PATH (`.`, or an empty entry, which means the same) made shutil.which answer `./bwrap`
where the folder the runner started in held one, and that relative path was exec'ed again in each command's
own cwd: the sample's workspace, where the agent may put a `bwrap` of its own, run outside the sandbox (and
nsenter, which a root runner execs there before any drop, as root). Only PATH's absolute folders are searched."""

from __future__ import annotations

import functools
import os
import shutil

from trajforge.errors import SetupError

MISSING = (
    "--environment=bwrap needs bubblewrap, which is in no absolute folder of PATH: install it "
    "(apt-get install bubblewrap, dnf install bubblewrap) or choose another --environment"
)


def absolute_path_only() -> None:
    """This process's PATH without its relative folders (`.`, an empty entry), for every program it and its
    children find by name: the runner's cwd is no folder of programs (a `./sh` there ran as root in a user
    namespace of the verification's, a `./rm` as root when a tree was too deep for rmtree: review 12)."""
    path = os.environ.get("PATH")
    if path is not None:  # none left: the system's default (an empty PATH would mean the cwd again)
        kept = os.pathsep.join(folder for folder in path.split(os.pathsep) if os.path.isabs(folder))
        os.environ["PATH"] = kept or os.defpath


def bwrap() -> str:
    """bwrap's absolute real path on this process's PATH; SetupError (MISSING) where none is."""
    found = find("bwrap")
    if found is None:
        raise SetupError(MISSING)
    return os.path.realpath(found)


def program(name: str) -> str:
    """`name`'s absolute path on this process's PATH (its link kept: pasta is passt by another name); where
    none is, /usr/bin/`name`, which fails to run as the bare name did, but is never looked for in a cwd."""
    return find(name) or f"/usr/bin/{name}"


def find(name: str, also: str = "") -> str | None:
    """`name`'s absolute path in PATH's absolute folders, then in `also` (folders as PATH names them); or None."""
    return _found(name, os.pathsep.join(filter(None, (os.environ.get("PATH", os.defpath), also))))


@functools.cache
def _found(name: str, path: str) -> str | None:
    absolute = os.pathsep.join(folder for folder in path.split(os.pathsep) if os.path.isabs(folder))
    return shutil.which(name, path=absolute)
