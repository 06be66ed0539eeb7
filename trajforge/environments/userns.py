"""Two uids in one bwrap sandbox: the model's and the verification's.

A hidden test has to run the model's code and then decide; as one uid, that code could read the
test's expected values in $TESTS_DIR or take the test's descriptors. So a root runner gives every bwrap
command of a worker one user namespace with two uids mapped (made once per worker process, kept by a
descriptor; bwrap joins it with `--userns FD`, FD the one OPENED_AT a command's chain opens it at):

- the agent, uid 1000 inside (AGENT_UID), `nobody` on the host, no capability: every command of the
  model, and whatever the verification starts behind `$AS_AGENT`;
- the verifier, uid 1001 inside, VERIFIER_HOST_UID on the host: the verify command and a Python
  verifier's commands. It alone reads the hidden tests (its folder, mode 0700). Its capabilities hold in
  this namespace only, where no host uid but these two exists: to become the agent ($AS_AGENT) and to
  read and write the agent's files in the workspace.

The agent's uid cannot trace, signal or take descriptors from the verifier's processes (another uid,
no capability), besides the seccomp filter. Only root can map two uids; elsewhere (a runner that is not
root, root of an `unshare -r` namespace) commands are one uid and `$AS_AGENT` is empty: the run says so.

The namespace is made by the verifier's host uid, not by root: the kernel charges per-user quotas (inotify
instances, message queue bytes, queued signals) in every user namespace above a process, as the uid that made
it: made by root, the model's code a verification ran ($AS_AGENT) held the host's root's 128 inotify
instances, and no root process of the host (the runner, systemd, the docker engine) could make one (review
17). Its owner is then that uid, whose processes in the host's namespace would hold every capability in it;
none runs there, and one would trace the verifier's processes anyway (the same uid).

The helper becomes that uid and makes the namespace without an exec between (HELPER): every process of every
worker's namespace counts in the host's as the owner's (the verifiers' and the model's code their
verifications ran), and the kernel fails an exec after a change of uid with EAGAIN while that uid's count is
over RLIMIT_NPROC: a new worker whose helper was exec'ed as 65533 then had one uid for good, and the model's
code its verifications ran read $TESTS_DIR, without a word (review 18). It also lifts its RLIMIT_NPROC first
(to none where it may, CAP_SYS_RESOURCE; else to its hard limit), which bounds the owner's count of every
namespace's processes together (a root-made namespace had no such bound): past it their forks fail, loudly.
"""

from __future__ import annotations

import os
import subprocess
import sys

from trajforge.environments.limits import NOBODY, mapped
from trajforge.environments.programs import program

AGENT_UID = 1000
VERIFIER_UID = 1001
VERIFIER_HOST_UID = 65533  # next to nobody: no account of the host owns files as it
# Where a command's exec chain opens the namespace for bwrap (limits.confined): below 10, so that the clean
# room's shell (dash) closes it before the command runs, as it closes every descriptor it names (shell.py).
OPENED_AT = 9
VERIFIER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
SETPRIV = program("setpriv")
# What a verification puts before a command to run it as the agent: no capability left, a /tmp HOME
# (the verifier's is its own, 0700), and not even the path of the tests.
AS_AGENT = (
    f"{SETPRIV} --reuid={AGENT_UID} --regid={AGENT_UID} --clear-groups --inh-caps=-all -- "
    "env -u TESTS_DIR HOME=/tmp TMPDIR=/tmp"
)
ONE_UID_REASON = "only a runner that is root on the host can give the verification a uid of its own"
# The helper (argv[1]: the uid): what it does as that uid is syscalls only, no exec (the docstring: review 18).
HELPER = """
import ctypes, os, resource, sys
uid = int(sys.argv[1])
try:  # no limit where it may be lifted (CAP_SYS_RESOURCE), else its hard one
    resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
except (ValueError, OSError):
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))
if os.getgroups():  # none to drop: no setgroups (a namespace may deny it)
    os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000):  # CLONE_NEWUSER
    sys.exit(1)
print("ready", flush=True)
sys.stdin.readline()
"""
_made: dict[int, int | None] = {}  # per process (a forked worker makes its own): the namespace's descriptor


def possible() -> bool:
    return os.geteuid() == 0 and mapped(NOBODY) and mapped(VERIFIER_HOST_UID)


def namespace_fd() -> int | None:
    """This process's two-uid user namespace (made on first use), or None where there can be none."""
    pid = os.getpid()
    if pid not in _made:
        _made[pid] = _make() if possible() else None
    return _made[pid]


def _make() -> int | None:
    # A helper enters a new user namespace and waits; we map its two uids (root may write both lines) and
    # keep a descriptor of the namespace, which outlives the helper. The helper is the verifier's host uid
    # (the docstring: made by root, the namespace's quotas were the host's root's); without CAP_SETUID it
    # exits at once, and it could not map two uids either.
    helper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", HELPER, str(VERIFIER_HOST_UID)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        if helper.stdout is None or helper.stdout.readline() != b"ready\n":
            return None
        mapping = f"{AGENT_UID} {NOBODY} 1\n{VERIFIER_UID} {VERIFIER_HOST_UID} 1\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{helper.pid}/{name}", "w") as handle:
                handle.write(mapping)
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        if helper.stdin:
            helper.stdin.close()
        helper.wait()


def identity(verifier: bool) -> list[str]:
    """bwrap's arguments for a command as the agent or (`verifier`) as the verification, in the namespace its
    chain opened at OPENED_AT."""
    uid = VERIFIER_UID if verifier else AGENT_UID
    caps = [arg for cap in VERIFIER_CAPS for arg in ("--cap-add", cap)] if verifier else []
    return ["--userns", str(OPENED_AT), "--uid", str(uid), "--gid", str(uid), "--cap-drop", "ALL", *caps]


def one_uid_warning(kind: str) -> str:
    """What the run says at start when it has hidden tests and the backend runs them as the model's uid."""
    why = ONE_UID_REASON if kind == "bwrap" else f"--environment={kind} has one uid for commands"
    return (
        f"$AS_AGENT is empty with --environment={kind} ({why}): code a verify command runs can read "
        "$TESTS_DIR; see docs/sandbox.md"
    )


def has_two_uids(kind: str) -> bool:
    return kind == "bwrap" and namespace_fd() is not None
