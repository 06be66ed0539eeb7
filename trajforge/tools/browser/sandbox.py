"""Chromium never runs as root without a sandbox: it renders pages the model chose.

Where bwrap works, Chromium runs inside it as the sandbox's uid (bwrap.SANDBOX_UID) in a user namespace
with no capability, the system read-only, a private /tmp and /dev/shm, its own PID namespace (so every
Chromium process ends with the browser, and the browser with the run: --die-with-parent), sharing only
the network (it reaches pages through the guard proxy on loopback) and its profile folder. Inside, its
own sandbox is off (--no-sandbox): bwrap is the sandbox. Without bwrap, a runner that is not root runs
Chromium with its own sandbox on; a root runner without bwrap gets no browser, and says why.

Playwright appends its own arguments (the profile folder among them) after ours, so the browser it
starts is a small script that reads the profile folder from them and execs bwrap; written for one
launch, it removes itself as it starts (Chromium starts its helpers through /proc/self/exe, not the
script), so a launch killed midway leaves nothing behind.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import tempfile

from trajforge.environments import EnvironmentSettings, programs
from trajforge.environments.bwrap import SYSTEM_DIRS, UNPRIVILEGED, BwrapBackend, system_mounts
from trajforge.environments.limits import NOBODY, host_user
from trajforge.errors import SetupError, UsageError

NO_SANDBOX = "--no-sandbox"
ROOT_REFUSED = "Chromium does not run as root without a sandbox, and bwrap cannot sandbox it here: {problem}"
HOST_UID = NOBODY  # what a root runner's Chromium runs as on the host (nobody), uid 1000 inside bwrap
# The font cache, read-only where it exists, so Chromium need not rebuild it at every launch.
SHARED_READ_ONLY = ("/var/cache/fontconfig",)


@functools.cache
def bwrap_problem() -> str | None:
    """Why bwrap cannot sandbox Chromium here (its check's message: a root runner's refusals too), else None."""
    try:
        BwrapBackend.check(EnvironmentSettings(kind="bwrap"))
    except (SetupError, UsageError) as exc:
        return str(exc)
    return None


@functools.cache
def no_user_namespaces() -> list[str]:
    """bwrap's --disable-userns where it has it (0.8 on): a page that takes the renderer makes no user
    namespace of its own, root in it with every capability. Chromium's own sandbox, which needs them, is off."""
    try:
        usage = subprocess.run([programs.bwrap(), "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return ["--disable-userns"] if "--disable-userns" in usage.stdout + usage.stderr else []


def script(executable: str) -> str:
    """The launcher Playwright runs in place of Chromium: bwrap around it, its profile folder bound."""
    sandbox = [programs.bwrap(), "--unshare-all", "--share-net", *UNPRIVILEGED, *no_user_namespaces()]
    sandbox += ["--die-with-parent", "--new-session", *system_mounts(), "--dev", "/dev", "--proc", "/proc"]
    sandbox += ["--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--setenv", "HOME", "/tmp"]
    for path in SHARED_READ_ONLY:
        if os.path.isdir(path):
            sandbox += ["--ro-bind", path, path]
    real = os.path.realpath(executable)
    in_system = any(real.startswith(path + "/") for path in SYSTEM_DIRS)
    if not in_system:  # a BROWSER_EXECUTABLE of the user's: its folder, read-only
        folder = os.path.dirname(real)
        sandbox += ["--ro-bind", folder, folder]
    drop, own = [], ""
    # Not even the host's root: an unprivileged uid (where it can reach the executable's own folder).
    if os.geteuid() == 0 and in_system and programs.find("setpriv") and host_user() == HOST_UID:
        drop = [programs.program("setpriv"), f"--reuid={HOST_UID}", f"--regid={HOST_UID}", "--clear-groups"]
        own = f'[ -n "$profile" ] && chown -R {HOST_UID}:{HOST_UID} "$profile"\n'
    return (
        '#!/bin/sh\nrm -rf -- "${0%/*}"\nprofile=\n'
        'for arg; do case "$arg" in --user-data-dir=*) profile=${arg#--user-data-dir=} ;; esac; done\n'
        f"{own}"
        'set -- ${profile:+--bind "$profile" "$profile"} -- ' + shlex.quote(real) + ' "$@"\n'
        f'exec {shlex.join([*drop, *sandbox])} "$@"\n'
    )


class SandboxedBrowser:
    """What to hand Playwright's launch(): `executable` and `args`; close() removes the launcher script."""

    def __init__(self, executable: str, args: list[str]):
        self.folder = ""
        problem = bwrap_problem()
        if problem is None:
            self.folder = tempfile.mkdtemp(prefix="batch-runner-browser-")
            self.executable = os.path.join(self.folder, "chromium")
            with open(self.executable, "w") as handle:
                handle.write(script(executable))
            os.chmod(self.executable, 0o700)
            self.args = args
        elif os.geteuid() != 0:
            self.executable, self.args = executable, [arg for arg in args if arg != NO_SANDBOX]
        else:
            raise PermissionError(ROOT_REFUSED.format(problem=problem))

    def close(self) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
