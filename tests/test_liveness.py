"""A run's start removes what the runs that are gone left in its temporary folder (liveness.py), and nothing of a
run still going: each case in processes of its own with a private TMPDIR, whose markers no other test sees."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, wait_for

from trajforge.environments import EnvironmentSettings, liveness
from trajforge.environments.limits import Limits, SampleCgroup

# A run's process that holds its marker (made where there is none) and says so, then waits for its stdin to close.
HOLD = """
import sys
from trajforge.environments import liveness
from trajforge.environments.settings import EnvironmentSettings
liveness.hold(EnvironmentSettings(run_dir=sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""
# Another run's start: the runs its sweep found gone (what `remove` is given), one a line.
SWEEP = """
import sys
from trajforge.environments import liveness
from trajforge.environments.settings import EnvironmentSettings
removes = lambda gone: print("removes", gone.run_dir, flush=True)
swept = liveness.sweep(EnvironmentSettings(run_dir=sys.argv[1]), removes)
print("swept", *swept, flush=True)
"""
# A run's start as the runner makes it.
PREPARE = """
import sys
from trajforge.environments.local import LocalBackend
from trajforge.environments.settings import EnvironmentSettings
LocalBackend.prepare_run(EnvironmentSettings(run_dir=sys.argv[1]), False)
"""
# A sample's cgroup of the run as the run makes it in this TMPDIR, with a command in it; its pid, then it waits.
SAMPLE = """
import subprocess, sys
from trajforge.environments.limits import Limits, SampleCgroup, confined
from trajforge.environments.local import cgroup_prefix
from trajforge.environments.settings import EnvironmentSettings
cgroup = SampleCgroup(Limits(max_memory_mb=256), cgroup_prefix(EnvironmentSettings(run_dir=sys.argv[1])))
assert cgroup.make()
command = subprocess.Popen(confined(["sleep", "300"], cgroup.limits, cgroup.paths))
print(command.pid, flush=True)
sys.stdin.read()
command.kill()
cgroup.remove()
"""


def python(script: str, tmp: Path, *args: str, **kwargs) -> subprocess.Popen:
    environ = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", script, *args], env=environ, text=True, **kwargs)


def ran(script: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """`script` run to its end; HOLD ends at once (its stdin is no test's: under `pytest -s` it read the terminal's,
    or a pipe's that never closed, and the test failed after a minute)."""
    process = python(script, tmp, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def a_gone_run(tmp: Path, run_dir: str) -> Path:
    """The marker of a run whose processes are all gone (one held it and ended), in `tmp`."""
    assert ran(HOLD, tmp, run_dir).returncode == 0
    tag = EnvironmentSettings(run_dir=run_dir).run_tag
    marker = tmp / f"{liveness.PREFIX}{tag}{liveness.SUFFIX}"
    assert marker.is_file()
    return marker


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace delays the sweep's flock")
@pytest.mark.parametrize("resumed", [False, True])
def test_a_sweep_slow_to_lock_a_marker_removes_no_run_that_made_a_new_one_meanwhile(tmp_path, resumed):
    """A start (B) looked at a gone run's marker, then took its lock late (its flock delayed by strace): meanwhile
    another start (C) removed that run's leftovers and unlinked the marker, and the run, resumed, made a new one
    that its process holds. B got the old file's lock, which nobody held, and removed what the live run had
    made, then unlinked its marker (review 20): now it takes nothing whose marker is no longer the file at its
    path. Its honest twin: no other start and no resume, B's late lock removes the gone run's leftovers."""
    tmp, run_dir = tmp_path / "tmp", str(tmp_path / "run")
    tmp.mkdir()
    marker = a_gone_run(tmp, run_dir)
    environ = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    delayed = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=flock", "-e", "inject=flock:delay_enter=3000000"]
    slow = subprocess.Popen(
        [*delayed, sys.executable, "-c", SWEEP, str(tmp_path / "B")], env=environ, text=True, stdout=subprocess.PIPE
    )
    resumed_run = None
    try:
        time.sleep(1.5)  # B has opened the marker and looked at it, and waits in its flock
        if resumed:
            other = ran(SWEEP, tmp, str(tmp_path / "C"))
            assert other.stdout.split() == ["removes", run_dir, "swept", run_dir], other.stderr
            resumed_run = python(HOLD, tmp, run_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert resumed_run.stdout is not None and resumed_run.stdout.readline() == "held\n"
        said, _ = slow.communicate(timeout=60)
        left = marker.is_file()
    finally:
        slow.kill()
        if resumed_run is not None:
            resumed_run.communicate()
    if resumed:
        assert said.split() == ["swept"] and left  # the live run's new marker stays, nothing of it removed
    else:
        assert said.split() == ["removes", run_dir, "swept", run_dir] and not left


ODD = {"list": "[" * 60_000, "object": '{"run_dir": ' * 30_000, "short": "[1]", "text": '"run_dir"', "nul": "\0"}


@pytest.mark.parametrize("text", ODD.values(), ids=ODD.keys())
def test_a_marker_that_names_no_run_fails_no_start_and_a_gone_run_beside_it_is_swept(tmp_path, text):
    """A file at a marker's name whose JSON nests deeper than the parser goes raised RecursionError from the sweep:
    every later start of a run of that user on the machine failed with a traceback (review 20). It is left alone
    now, like any file that names no run, and the gone run's marker beside it is swept as before."""
    tmp, run_dir = tmp_path / "tmp", str(tmp_path / "run")
    tmp.mkdir()
    odd = tmp / f"{liveness.PREFIX}{'0' * 12}{liveness.SUFFIX}"
    odd.write_text(text)
    marker = a_gone_run(tmp, run_dir)
    started = ran(PREPARE, tmp, str(tmp_path / "other"))
    assert started.returncode == 0, started.stderr
    assert odd.read_text() == text and not marker.exists()  # the gone run's swept (its marker last)


def _cgroups() -> bool:
    probe = SampleCgroup(Limits(max_memory_mb=256), "batch-runner-probe-")
    made = probe.make()
    probe.remove()
    return made


@pytest.mark.skipif(not _cgroups(), reason="no cgroup can be made here")
@pytest.mark.parametrize("same_folder", [False, True])
def test_a_run_gone_from_one_temporary_folder_keeps_its_commands_running_from_another(tmp_path, same_folder):
    """A run killed with TMPDIR=A, resumed with TMPDIR=B, holds its marker in B; another run started with TMPDIR=A
    found its old marker in A unheld and removed the run's cgroups, which are the machine's: it killed the
    resumed run's commands (review 20). A start ends only the cgroups made with its own temporary folder now.
    Its honest twin: the run's command in A, the start in A ends it."""
    first, second, run_dir = tmp_path / "a", tmp_path / "b", str(tmp_path / "run")
    first.mkdir()
    second.mkdir()
    a_gone_run(first, run_dir)
    sample = python(SAMPLE, first if same_folder else second, run_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert sample.stdout is not None
        pid = int(sample.stdout.readline())
        marker = first / f"{liveness.PREFIX}{EnvironmentSettings(run_dir=run_dir).run_tag}{liveness.SUFFIX}"
        started = ran(PREPARE, first, str(tmp_path / "other"))
        assert started.returncode == 0 and not marker.exists(), started.stderr  # swept
        if same_folder:
            wait_for(lambda: _gone(pid), timeout=10, what="the gone run's command to be killed")
        else:
            time.sleep(0.5)
            assert not _gone(pid)
    finally:
        sample.communicate()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another user's is made by root")
@pytest.mark.parametrize("owner", ["another user", "this user"])
def test_a_lock_held_on_another_user_s_file_at_a_marker_s_name_holds_no_start(tmp_path, owner):
    """In a shared /tmp another user put a file at a run's marker name (its folder read from its command line),
    writable by all, and held its lock: the run's start opened it all the same and waited on that lock forever
    (review 21). Another user's file is not waited on now: the start goes on, holding no marker. Its honest twin:
    the file is this user's, a gone run's marker that another start holds while it removes the run's leftovers,
    and the start waits for that, then holds it."""
    tmp, run_dir = tmp_path / "tmp", str(tmp_path / "run")
    tmp.mkdir(mode=0o1777)
    tmp.chmod(0o1777)
    marker = tmp / f"{liveness.PREFIX}{EnvironmentSettings(run_dir=run_dir).run_tag}{liveness.SUFFIX}"
    marker.write_text("")
    marker.chmod(0o666)
    if owner == "another user":
        os.chown(marker, 65534, 65534)
    fd = os.open(marker, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # that user's lock (or the other start's), on the same file
        start = python(PREPARE, tmp, run_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            if owner == "another user":
                assert start.wait(timeout=60) == 0
            else:
                with pytest.raises(subprocess.TimeoutExpired):
                    start.wait(timeout=2)  # waits for the lock
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            _, stderr = start.communicate(timeout=60)
    finally:
        os.close(fd)
    assert start.returncode == 0, stderr
    assert marker.stat().st_uid == (65534 if owner == "another user" else 0)


@pytest.mark.parametrize("name", [b"run-\xff", "run-\u00e9".encode()], ids=["not UTF-8", "UTF-8"])
def test_a_run_folder_whose_name_is_no_utf_8_starts_and_is_swept_once_gone(tmp_path, name):
    """A run folder named in bytes that are no UTF-8 (Python's surrogate escapes) failed the tag's digest with
    UnicodeEncodeError: since the marker is held at the run's start, every such run's start crashed; a TMPDIR so
    named failed the digest of its cgroups' names, and a gone run's marker there was never swept (review 21).
    Both are digests of the names' bytes now. Its honest twin: UTF-8 names keep the digests they had (an older
    version's run still finds its leftovers), and both runs' markers are held and, once gone, swept."""
    tmp = Path(os.fsdecode(os.fsencode(tmp_path / "tmp-") + name))
    tmp.mkdir()
    run_dir = os.fsdecode(os.path.join(os.fsencode(tmp_path), name))
    if name.decode(errors="ignore").encode() == name:
        assert EnvironmentSettings(run_dir=run_dir).run_tag == hashlib.sha256(run_dir.encode()).hexdigest()[:12]
    marker = a_gone_run(tmp, run_dir)
    started = ran(PREPARE, tmp, str(tmp_path / "other"))
    assert started.returncode == 0, started.stderr
    assert not marker.exists()  # swept


@pytest.mark.parametrize("left", ["nothing to run", "a prompt to run"])
def test_a_killed_run_s_resume_leaves_no_marker_whatever_it_has_left_to_run(run, tmp_path, monkeypatch, left):
    """A killed run's resume with nothing left to run (its prompts done, or out of --max_attempts) removed what it
    had left on a thread of its own without holding its marker: another run's start removed the same leftovers
    at the same time, and the killed run's marker stayed after the resume for a later start to sweep (review 21).
    It holds it now, as a resume with a prompt to run (the honest twin) does, and its end removes it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # for the runs, which are processes of their own
    first = run([{"prompt": "hi"}], "--environment=local", "--distribution=terminal_only")
    assert first.code == 0 and not list(tmp.glob("*" + liveness.SUFFIX)), first.stderr
    marker = a_gone_run(tmp, str(first.run_dir.resolve()))  # as if it had been killed
    entries = [{"prompt": "hi"}] + ([{"prompt": "again"}] if left == "a prompt to run" else [])
    resumed = run(entries, "--environment=local", "--distribution=terminal_only", "--resume")
    assert resumed.code == 0, resumed.stderr
    assert not marker.exists()


@pytest.mark.parametrize("mode", ["--check_tasks", "--rescore"])
def test_a_check_of_the_tasks_or_a_rescore_leaves_no_marker(run, tmp_path, monkeypatch, mode):
    """--check_tasks and --rescore make their samples' folders as a run does, so they hold the run's marker; they
    left it at their end, for every later start to look at (500 markers cost a start 1.2 s). Their end removes
    it, as a run's does (the run before the rescore is the honest twin)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # for the runs, which are processes of their own
    entry = {"prompt": "hi", "verify": "test -f done.txt", "solution": "touch done.txt"}
    flags: tuple[str, ...] = ("--environment=local", "--distribution=terminal_only")
    if mode == "--rescore":
        first = run([entry], *flags)
        assert first.code == 0 and not list(tmp.glob("*" + liveness.SUFFIX)), first.stderr
        flags += ("--resume",)
    ended = run([entry], *flags, mode)
    assert ended.code == 0, ended.stdout + ended.stderr
    assert not list(tmp.glob("*" + liveness.SUFFIX))
