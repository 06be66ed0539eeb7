"""bwrap, which the runner execs by name, found on PATH once as an absolute real path.

A relative folder of PATH (`.`, or an empty entry, which means the same) made shutil.which answer `./bwrap`
where the folder the runner started in held one, and that relative path was exec'ed again in each command's
own cwd: the sample's workspace, where the agent may put a `bwrap` of its own, run outside the sandbox. Only
PATH's absolute folders are searched."""

from __future__ import annotations

import functools
import os
import shutil

from trajforge.errors import SetupError

MISSING = (
    "--environment=bwrap needs bubblewrap, which is in no absolute folder of PATH: install it "
    "(apt-get install bubblewrap, dnf install bubblewrap) or choose another --environment"
)


def bwrap() -> str:
    """bwrap's absolute real path on this process's PATH; SetupError (MISSING) where none is."""
    found = _found("bwrap", os.environ.get("PATH", os.defpath))
    if found is None:
        raise SetupError(MISSING)
    return found


@functools.cache
def _found(name: str, path: str) -> str | None:
    absolute = os.pathsep.join(folder for folder in path.split(os.pathsep) if os.path.isabs(folder))
    found = shutil.which(name, path=absolute)
    return os.path.realpath(found) if found else None
