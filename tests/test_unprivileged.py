"""The sandbox a command cannot leave: in bwrap every command, the agent's and the verification's, runs as
a non-root uid in a user namespace of its own with no capability, whoever started the runner, and hits
its limits (processes, memory, file size, tmpfs) as ordinary errors. Real bwrap, through the environment API."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import glob
import json
import os
import random
import re
import resource
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import ROOT, Runner, detach_as_bound, loop_sequence, source, tool_results, wait_for, write_dataset
from test_environments import _available
from test_sandbox import bwrap, settings  # noqa: F401  (the fixture)
from test_task_folders import deepest_readable

from trajforge.environments import (
    EnvironmentSettings,
    backend_class,
    backend_for,
    disk,
    liveness,
    loopback,
    loops,
    netns,
    prepare_run,
    tmpfs,
    userns,
)
from trajforge.environments.limits import Limits, host_user, unenforced
from trajforge.environments.local import workspace_prefix
from trajforge.environments.trees import remove_tree
from trajforge.verification.host_folders import HostFolders

HOST_MARK = "3.14159"  # a sleep no other test runs: how the host finds the sandboxed command
PROBE = (
    "grep CapEff /proc/self/status; id -u; "
    "mount -o remount,rw,bind /usr 2>/dev/null && echo remounted-usr; "
    "mount -o remount,rw,bind /etc 2>/dev/null && echo remounted-etc; "
    "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>/dev/null && echo raw-socket; "
    "touch x && echo workspace-writable; grep NoNewPrivs /proc/self/status; "
    # The host's kernel settings, root-only files and setuid programs: none is the sandbox's.
    "python3 -c \"import os; os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY)\" 2>/dev/null && echo sysctl; "
    "head -c1 /etc/shadow > /dev/null 2>&1 && echo shadow"
)


async def _probe(env_settings) -> tuple[str, str]:
    env = await backend_for(env_settings).open({})
    try:
        agent = await env.exec(PROBE)
        await env.enter_clean_room()
        verification = await env.exec(PROBE)
        return agent.output, verification.output
    finally:
        await env.close()


def test_commands_have_no_capability_and_a_non_root_uid(bwrap, tmp_path):  # noqa: F811
    agent, verification = asyncio.run(_probe(settings("bwrap", tmp_path)))
    # The verification's uid (two uids where the runner is root) holds, in its namespace only, what it
    # needs to run the model's code as the agent and to read and write the agent's files (userns.py).
    expected = ["CapEff:", "00000000000000ca", "1001"] if userns.possible() else ["CapEff:", "0000000000000000", "1000"]
    for output, first in ((agent, ["CapEff:", "0000000000000000", "1000"]), (verification, expected)):
        lines = output.split()
        assert lines[:3] == first, output
        assert "remounted-usr" not in lines and "remounted-etc" not in lines and "raw-socket" not in lines
        assert "workspace-writable" in lines and "NoNewPrivs:\t1" in output, output
        assert "sysctl" not in lines and "shadow" not in lines, output


async def _host_status(env_settings) -> dict[str, str]:
    """The host's /proc status of a sandboxed command (its fields by name), read while it runs."""
    env = await backend_for(env_settings).open({})
    try:
        running = asyncio.create_task(env.exec(f"exec sleep {HOST_MARK}"))
        for _ in range(200):
            for path in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):
                    # The command itself: the runner's own wrapper (sh, then nsenter) holds the mark in its
                    # arguments too, and is root until nsenter drops it, before any of the command runs.
                    if path.read_bytes().split(b"\0")[:2] == [b"sleep", HOST_MARK.encode()]:
                        lines = (path.parent / "status").read_text().splitlines()
                        return dict(line.split(":", 1) for line in lines if ":" in line)
            await asyncio.sleep(0.02)
        raise AssertionError("the command never showed up")
    finally:
        running.cancel()
        await env.close()


@pytest.mark.skipif(host_user() is None, reason="the runner is not the host's root: nothing to drop")
def test_a_root_runner_s_commands_are_nobody_on_the_host(bwrap, tmp_path):  # noqa: F811
    # So no setuid program it plants, no root-only file and no /proc/sys setting is root's to it.
    assert int(asyncio.run(_host_status(settings("bwrap", tmp_path)))["Uid"].split()[1]) == host_user()


@pytest.mark.skipif(host_user() is None, reason="the runner is not the host's root: nothing to drop")
def test_a_root_runner_s_commands_keep_no_group_no_capability_and_no_way_back(bwrap, tmp_path):  # noqa: F811
    # Every step from the root runner to the command, as the host sees the command: nobody's uid and gid
    # (real, effective, saved, file system), none of the runner's supplementary groups, no capability in any
    # set (the bounding set too), no_new_privs and the seccomp filter. The runner holds two groups here.
    groups = os.getgroups()
    os.setgroups([10, 20])
    try:
        status = {name: value.strip() for name, value in asyncio.run(_host_status(settings("bwrap", tmp_path))).items()}
    finally:
        os.setgroups(groups)
    nobody = " ".join([str(host_user())] * 4)
    assert (status["Uid"].split(), status["Gid"].split(), status["Groups"]) == (nobody.split(), nobody.split(), "")
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[name], 16) == 0, (name, status)
    assert (status["NoNewPrivs"], status["Seccomp"]) == ("1", "2"), status


def test_docker_containers_have_no_capability_and_no_new_privileges(docker_host, tmp_path):
    env_settings = settings("docker", tmp_path, default_image="batch-runner-test/alpha:1")
    for output in asyncio.run(_probe(env_settings)):
        assert "CapEff:\t0000000000000000" in output and "NoNewPrivs:\t1" in output, output
        assert "workspace-writable" in output
        assert "remounted-usr" not in output and "raw-socket" not in output


# -- limits ---------------------------------------------------------------------------------------
SMALL = Limits(max_processes=20, max_memory_mb=100, max_file_size_mb=1)
FORK_MANY = "i=0; while [ $i -lt 60 ]; do sleep 3 & i=$((i+1)); done 2>&1 | tail -1"
GREEDY = "python3 -c 'b = bytearray(300 * 1024 * 1024); print(len(b))'"
BIG_FILE = "head -c 3000000 /dev/zero > big; wc -c < big"


async def _limited(env_settings, commands: list[str]) -> list:
    env = await backend_for(env_settings).open({})
    try:
        return [await env.exec(command) for command in commands]
    finally:
        await env.close()


def limited_kind(request) -> str:
    kind = _available(request)
    warning = unenforced(SMALL, kind, backend_class(kind).LIMITS)
    if kind != "docker" and warning:
        pytest.skip(warning)
    return kind


@pytest.fixture(params=["local", "bwrap", "docker"])
def limited(request) -> str:
    return limited_kind(request)


def test_a_command_past_a_limit_fails_as_any_command_and_the_next_one_runs(limited, tmp_path, request):
    if limited == "docker":
        request.getfixturevalue("docker_host")
    env_settings = settings(limited, tmp_path, limits=SMALL, default_image="batch-runner-test/alpha:1")
    # The forks last: their sleeps may outlive the command (local), holding the sample's processes.
    greedy, big, forks, after = asyncio.run(_limited(env_settings, [GREEDY, BIG_FILE, FORK_MANY, "echo still here"]))
    assert "fork" in forks.output.lower() or "resource" in forks.output.lower(), forks
    assert greedy.exit_code != 0 and "314572800" not in greedy.output, greedy
    assert big.output.split()[-1] == "1048576", big  # cut at the limit: the write failed
    assert after.output == "still here\n" and after.exit_code == 0


def test_a_bwrap_sample_runs_more_commands_than_its_process_limit(bwrap, tmp_path):  # noqa: F811
    """bwrap's PID-namespace init outlives bwrap and, re-parented to the worker, stayed a zombie counted in
    the sample's pids cgroup until the sample's end: past --max_processes commands, none could fork ("Can't
    fork for pid 1"). Each is collected within a second now, so commands a model spaces out run on."""
    limits = Limits(max_processes=16, max_memory_mb=0)
    if unenforced(limits, "bwrap", backend_class("bwrap").LIMITS):
        pytest.skip("no cgroup bounds bwrap's processes here")
    done = asyncio.run(_limited(settings("bwrap", tmp_path, limits=limits), ["sleep 0.15; echo ok"] * 20))
    assert [(result.output, result.exit_code) for result in done] == [("ok\n", 0)] * 20, done


def test_the_runners_own_processes_are_not_limited(tmp_path):
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    asyncio.run(_limited(settings("local", tmp_path, limits=SMALL), ["true"]))
    assert resource.getrlimit(resource.RLIMIT_FSIZE) == before
    with open(f"/proc/{os.getpid()}/cgroup") as handle:
        assert "batch-runner-" not in handle.read()


def test_bwrap_dev_shm_is_a_bounded_tmpfs(bwrap, tmp_path):  # noqa: F811
    limits = Limits(max_processes=0, max_memory_mb=0, max_file_size_mb=2)
    (shm,) = asyncio.run(_limited(settings("bwrap", tmp_path, limits=limits), ["df -k /dev/shm | tail -1"]))
    assert shm.output.split()[1] == "2048", shm


@pytest.mark.skipif(not tmpfs.possible(), reason="a tmpfs on the host needs the host's root")
def test_bwrap_tmp_is_a_bounded_tmpfs_kept_between_commands(bwrap, tmp_path):  # noqa: F811
    limits = Limits(max_processes=0, max_memory_mb=0, max_file_size_mb=2, max_disk_mb=0)  # no disk image holds it
    commands = ["head -c 1500000 /dev/zero > /tmp/a && echo first", "head -c 1500000 /dev/zero > /tmp/b", "ls /tmp"]
    first, second, listing = asyncio.run(_limited(settings("bwrap", tmp_path, limits=limits), commands))
    assert first.output.strip() == "first" and "No space left on device" in second.output, second
    assert "a" in listing.output.split(), listing  # the sample's /tmp, kept between its commands
    assert "size=2048k" not in Path("/proc/self/mounts").read_text()  # unmounted with the sample


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--max_processes=-1", "--max_processes must be at least 0"),
        ("--reward_range=1,0", "--reward_range must be"),
        ("--max_disk_mb=1", "--max_disk_mb must be 0 (no bound) or at least 2: a sample's disk keeps 1 MB"),
    ],
)
def test_bad_limits_and_ranges_stop_the_run_before_any_request(run_here, server, flag, message):
    result = run_here([{"prompt": "p"}], flag)
    assert result.code == 2 and message in result.stderr and not server.chat_requests()


# -- Chromium -------------------------------------------------------------------------------------
def _status(pid: str) -> dict:
    with open(f"/proc/{pid}/status") as handle:
        return dict(line.split(":\t", 1) for line in handle.read().splitlines() if ":\t" in line)


def _ours(status: dict) -> bool:
    """A descendant of this test's process (other tests on the machine may run their own Chromium)."""
    while status.get("PPid", "0") not in ("0", "1"):
        if status["PPid"] == str(os.getpid()):
            return True
        status = _status(status["PPid"])
    return False


def _chromium_status() -> list[dict]:
    """uid and capabilities of this test's Chromium processes, read from the host's /proc."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                if not handle.read().startswith(b"/usr/lib/chromium/"):
                    continue
            status = _status(name)
            if _ours(status):
                found.append(status)
        except OSError:
            continue
    return found


def test_chromium_runs_unprivileged_in_bwrap_and_ends_with_the_browser(bwrap):  # noqa: F811
    from trajforge.tools.browser.runtime import launch

    async def body():
        playwright, browser = await launch("/usr/bin/chromium")
        try:
            page = await (await browser.new_context()).new_page()
            await page.set_content("<h1>rendered</h1>")
            return await page.inner_text("h1"), _chromium_status()
        finally:
            await browser.close()
            await playwright.stop()

    text, processes = asyncio.run(body())
    assert text == "rendered" and processes
    for status in processes:
        assert status["CapEff"] == "0000000000000000", status
        assert status["Uid"].split()[0] != "0" and status["NoNewPrivs"] == "1", status
    wait_for(lambda: not _chromium_status(), 10, "every Chromium process to end with the browser")


def test_chromium_s_sandbox_makes_no_user_namespace_yet_starts_children(bwrap, tmp_path):  # noqa: F811
    # Issue 35: a page that took the renderer could `unshare -Ur` and be root with every capability there.
    from trajforge.tools.browser.sandbox import script

    launcher = tmp_path / "launcher" / "chromium"
    launcher.parent.mkdir()
    launcher.write_text(script("/bin/sh"))  # the launcher runs sh in Chromium's place, with its arguments
    launcher.chmod(0o700)
    probe = "unshare -Ur true 2>/dev/null && echo made; sh -c 'echo child'"
    done = subprocess.run([str(launcher), "-c", probe], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "child\n"), done


# -- seccomp --------------------------------------------------------------------------------------
TAKERS = ["process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "ptrace"]


@pytest.fixture(scope="module")
def take_probe(tmp_path_factory) -> bytes:
    if not shutil.which("gcc"):
        pytest.skip("the probe is C, built static: no gcc here")
    binary = tmp_path_factory.mktemp("probe") / "take_probe"
    source = Path(__file__).parent / "fixtures" / "take_probe.c"
    subprocess.run(["gcc", "-static", "-O1", "-o", str(binary), str(source)], check=True, capture_output=True)
    return binary.read_bytes()


@pytest.mark.parametrize("kind", ["bwrap", "docker", "local"], indirect=False)
def test_no_sandboxed_command_takes_a_process_s_memory_or_descriptors(kind, take_probe, tmp_path, request):
    # Issue 31: a filter denies them (EPERM) to the agent's commands and the verification's alike; local is
    # no sandbox and gets none, so there each call works as it does on the host.
    if kind == "docker":
        request.getfixturevalue("docker_host")
    elif kind == "bwrap":
        request.getfixturevalue("bwrap")
    env_settings = settings(kind, tmp_path, default_image="batch-runner-test/alpha:1")

    async def body() -> list[str]:
        env = await backend_for(env_settings).open({})
        try:
            await env.write_file("probe", take_probe)
            agent = await env.exec("chmod +x probe && ./probe")
            await env.enter_clean_room()
            return [agent.output, (await env.exec("./probe")).output]
        finally:
            await env.close()

    outcome = "ok" if kind == "local" else "EPERM"
    for output in asyncio.run(body()):
        assert output.splitlines() == [f"{name} {outcome}" for name in TAKERS], output


# A worker (its own process) whose runner holds a session keyring, as systemd gives each system service
# (KeyringMode=private) and pam_keyinit a login: each command of argv[2] runs in a sample of its own, in turn.
KEYRINGS = """
import asyncio, ctypes, json, sys
from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for
ctypes.CDLL(None, use_errno=True).syscall(250, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING: a new anonymous one
settings = EnvironmentSettings(kind="bwrap", command_timeout=20.0, run_dir=sys.argv[1])
async def main():
    plugins.load()
    outputs = []
    for command in json.loads(sys.argv[2]):
        env = await backend_for(settings).open({})
        try:
            outputs.append((await env.exec(command)).output)
        finally:
            await env.close()
    return outputs
print(json.dumps(asyncio.run(main())), flush=True)
"""
# add_key into the session (-3) and the user (-4) keyring of a key whose payload and description are a note;
# the note looked up in both (keyctl SEARCH, READ) and among the keys /proc/keys shows.
KEY_NOTE = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def note(ring):\n"
    "    key = libc.syscall(250, 10, ring, b'user', b'note-of-a-sample', 0)\n"
    "    data = ctypes.create_string_buffer(64)\n"
    "    size = libc.syscall(250, 11, key, data, 64) if key >= 0 else -1\n"
    "    return data.raw[:size].decode() if size >= 0 else os.strerror(ctypes.get_errno())\n"
    "if sys.argv[1] == 'add':\n"
    "    for ring in (-3, -4):\n"
    "        made = libc.syscall(248, b'user', b'note-of-a-sample', b'secret', 6, ring)\n"
    "        print('added' if made >= 0 else os.strerror(ctypes.get_errno()))\n"
    "else:\n"
    "    print(note(-3), note(-4), 'note-of-a-sample' in open('/proc/keys').read())\n"
)


def test_a_sample_leaves_no_kernel_key_for_the_next(bwrap, tmp_path):  # noqa: F811
    """(review 16) Every bwrap command possessed the runner's session keyring (inherited across nsenter, bwrap
    and the drop to the sandbox's uid; a systemd service has one of its own): a sample's add_key there was
    read back by every later sample of the run (the user keyring's key too, shown by /proc/keys, until the
    kernel collected it). The filter denies the keyring calls, as Docker's profile does; the twin passes its
    note in its own /tmp, which the next sample does not find, as before."""
    attack = f"python3 -c {shlex.quote(KEY_NOTE)}"
    honest = ["echo secret > /tmp/note; cat /tmp/note", "test -e /tmp/note || echo gone"]
    commands = [f"{attack} add", f"{attack} look", *honest]
    args = [sys.executable, "-c", KEYRINGS, str(tmp_path), json.dumps(commands)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stderr == "", done.stderr
    added, looked, twin, after = json.loads(done.stdout)
    assert "secret" not in looked and looked.split()[-1] == "False", (added, looked)  # the later sample found none
    assert added.split("\n")[:2] == ["Operation not permitted"] * 2, added
    assert (twin, after) == ("secret\n", "gone\n"), (twin, after)  # a sample's own note, its own; gone with it


# inotify_init until it fails, the count held for argv[1] seconds (the kernel's per-user quota: 128 by default).
INOTIFY_HOG = (
    "import ctypes, sys, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "held = []\n"
    "while len(held) < 4096 and (fd := libc.inotify_init()) >= 0:\n"
    "    held.append(fd)\n"
    "print('held', len(held), flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


async def _verification_holding_inotify(env_settings, command: str) -> tuple[str, list[str]]:
    """`command` run by a sample's verification, and the errors the host's root met making an inotify
    instance meanwhile (the runner's own process: every 50 ms while the command ran)."""
    libc = ctypes.CDLL(None, use_errno=True)
    failures: list[str] = []
    running = threading.Event()

    def probe() -> None:
        while running.is_set():
            fd = libc.inotify_init()
            if fd < 0:
                failures.append(os.strerror(ctypes.get_errno()))
            else:
                os.close(fd)
            time.sleep(0.05)

    env = await backend_for(env_settings).open({})
    try:
        await env.exec("echo agent")
        await env.enter_clean_room()
        await env.add_tests({"expected.txt": b"42\n"})
        running.set()
        watcher = threading.Thread(target=probe)
        watcher.start()
        try:
            done = await env.exec(command)
        finally:
            running.clear()
            watcher.join()
        return done.output, failures
    finally:
        await env.close()


@pytest.mark.skipif(not userns.possible(), reason="only a root runner gives the verification a namespace of its own")
def test_the_model_s_code_a_verification_runs_takes_no_kernel_quota_of_the_host_s_root(bwrap, tmp_path):  # noqa: F811
    """(review 17) The kernel charges what a process holds against per-user quotas (inotify instances and
    watches, message queue bytes, queued signals) in each user namespace above it, as the uid that made
    that namespace. The worker's two-uid namespace was made by root: the model's code a verification runs
    as the agent ($AS_AGENT) took the host's root's 128 inotify instances, and no root process of the host
    (the runner here, systemd, the docker engine) could make one while it held them. The namespace is made
    by the verifier's host uid now; the twin's verification still reads its tests, the agent still cannot,
    and both use inotify."""
    hog = f"$AS_AGENT python3 -c {shlex.quote(INOTIFY_HOG)} 3"
    held, failures = asyncio.run(_verification_holding_inotify(settings("bwrap", tmp_path), hog))
    assert held.startswith("held "), held
    assert failures == [], f"the host's root could not make an inotify instance {len(failures)} times: {held}"
    twin = (
        f"cat $TESTS_DIR/expected.txt; $AS_AGENT cat /tests/expected.txt 2>/dev/null || echo denied; "
        f"python3 -c {shlex.quote(INOTIFY_HOG)} 0; $AS_AGENT python3 -c {shlex.quote(INOTIFY_HOG)} 0"
    )
    honest, _ = asyncio.run(_verification_holding_inotify(settings("bwrap", tmp_path), twin))
    lines = honest.splitlines()
    assert lines[:2] == ["42", "denied"] and all(line.startswith("held ") for line in lines[2:]), honest


# A worker started anew (a Ray task's process, a restarted worker) under RLIMIT_NPROC argv[3] (soft:hard): its
# first verification runs argv[2]; prints its output, or the error the verification met. AT_START runs first,
# BEFORE_COMMAND before that command; LIMITS are the sample's.
WORKER = """
import asyncio, json, os, sys
AT_START
from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.environments.limits import Limits
settings = EnvironmentSettings(kind="bwrap", command_timeout=20.0, run_dir=sys.argv[1], limits=LIMITS)
async def main():
    plugins.load()
    env = await backend_for(settings).open({})
    try:
        await env.enter_clean_room()
        await env.add_tests({"expected.txt": b"42\\n"})
        BEFORE_COMMAND
        return (await env.exec(sys.argv[2])).output
    except OSError as exc:
        return f"error: {exc}"
    finally:
        await env.close()
print(json.dumps(asyncio.run(main())), flush=True)
"""
NEW_WORKER = WORKER.replace("AT_START", "").replace("LIMITS", "Limits()").replace("BEFORE_COMMAND", "")
HELD_MARK = "62.71828"  # a sleep no other test runs: the held processes, as the host counts them


def _held() -> int:
    count = 0
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            count += path.read_bytes().split(b"\0")[:2] == [b"sleep", HELD_MARK.encode()]
    return count


def _new_worker(tmp_path: Path, command: str) -> str:
    # Its soft RLIMIT_NPROC under what the held processes count (the hard one kept)
    argv = ["prlimit", "--nproc=40:", "--", sys.executable, "-c", NEW_WORKER, str(tmp_path), command]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


async def _new_worker_beside(env_settings, tmp_path: Path, command: str, hold: int) -> str:
    """A new worker's first verification of `command`, while a sample's verification holds `hold` processes
    of the model's code ($AS_AGENT)."""
    env = await backend_for(env_settings).open({})
    try:
        await env.enter_clean_room()
        release = os.path.join(env.workspace, "release")
        held = (
            f"$AS_AGENT sh -c 'for i in $(seq {hold}); do sleep {HELD_MARK} & done; "
            f"while [ ! -e {release} ]; do sleep 0.2; done; kill $(jobs -p)'"
        )
        holding = asyncio.ensure_future(env.exec(held))
        try:
            await asyncio.to_thread(wait_for, lambda: _held() >= hold, 60, f"{hold} processes held")
            return await asyncio.to_thread(_new_worker, tmp_path, command)
        finally:
            Path(release).touch()
            await holding
    finally:
        await env.close()


@pytest.mark.skipif(not userns.possible(), reason="only a root runner gives the verification a namespace of its own")
def test_a_verification_s_processes_leave_a_new_worker_its_two_uids(bwrap, tmp_path):  # noqa: F811
    """(review 18) Every process of a worker's two-uid namespace counts in the host's as the uid that made it
    (65533 since review 17), and the kernel fails an exec after a change of uid with EAGAIN while that uid's
    count is over RLIMIT_NPROC (root's own limit, binding no root process). A new worker's helper, exec'ed as
    65533 while the model's code of another sample's verification held 60 processes, failed: that worker
    had one uid for good, $AS_AGENT was empty, and the model's code read the tests, without a word. The twin,
    nothing held, reads them as the verification and not as the agent, as the attacked one must."""
    look = "cat $TESTS_DIR/expected.txt; $AS_AGENT cat /tests/expected.txt 2>/dev/null || echo denied"
    assert _new_worker(tmp_path, look) == "42\ndenied\n"
    beside = asyncio.run(_new_worker_beside(settings("bwrap", tmp_path), tmp_path, look, 60))
    assert beside == "42\ndenied\n", beside


# A worker with descriptors 3 to 9 taken before it opens a sample (no disk), what it opens lying above; argv[3]
# "free": 9 is closed before the verification's command argv[2], whose filter pipe then takes it.
FEW_DESCRIPTORS = (
    WORKER.replace("AT_START", 'while os.open("/dev/null", os.O_RDONLY) < 9:\n    pass')
    .replace("LIMITS", "Limits(max_disk_mb=0)")
    .replace("BEFORE_COMMAND", 'if sys.argv[3] == "free":\n            os.close(9)')
)


@pytest.mark.parametrize("nine", ["free", "taken"])
@pytest.mark.skipif(not userns.possible(), reason="only a root runner gives the verification a namespace of its own")
def test_a_verification_runs_whatever_descriptor_its_filter_pipe_takes(bwrap, tmp_path, nine):  # noqa: F811
    """(review 40) A verification's command chain opens the worker's two-uid namespace at descriptor 9 for bwrap
    (userns.OPENED_AT); bwrap's seccomp filter is passed at the pipe's own number, the lowest free one. In a
    worker with few open (the environment API in a program of its own, no disk: the first verification) that
    was 9: the namespace took its place, bwrap read the namespace as its filter ("Can't read seccomp data")
    and every verification failed. The twin, 9 taken, passes as ever."""
    look = "cat $TESTS_DIR/expected.txt; $AS_AGENT cat /tests/expected.txt 2>/dev/null || echo denied"
    argv = [sys.executable, "-c", FEW_DESCRIPTORS, str(tmp_path), look, nine]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == "42\ndenied\n", done.stdout


# -- disk -----------------------------------------------------------------------------------------
DISK = Limits(max_disk_mb=16)  # and 1,024 inodes
FILL = "head -c 40000000 /dev/zero > {where}/big; wc -c < {where}/big"
MANY_FILES = (
    "mkdir many && i=0; while [ $i -lt 3000 ]; do true 2>/dev/null >many/f$i || break; i=$((i+1)); done; echo $i"
)


@pytest.fixture(params=["local", "bwrap"])
def disk_kind(request) -> str:
    kind = _available(request)
    warning = disk.unenforced(DISK.max_disk_mb, kind, backend_class(kind).LIMITS)
    if warning:
        pytest.skip(warning)
    return kind


async def _disk_samples(env_settings) -> tuple[list, list, list]:
    """Two samples of one worker, one after the other (the second on the disk the first gave back)."""
    backend = backend_for(env_settings)
    env = await backend.open({})
    try:
        size = os.statvfs(env.workspace)
        agent = [await env.exec(command) for command in ("echo secret > left.txt", FILL.format(where="."))]
        agent.append(await env.exec("rm big; " + MANY_FILES + "; rm -r many"))
        await env.enter_clean_room()
        verification = [await env.exec("head -c 9000000 /dev/zero > half; echo done")]
        verification.append(await env.exec(FILL.format(where="$TMPDIR")))  # the other half of the same disk
    finally:
        await env.close()
    second = await backend.open({})
    try:
        after = [await second.exec("ls -A; df -P . | tail -1"), await second.exec(MANY_FILES)]
    finally:
        await second.close()
    return [size.f_blocks * size.f_frsize], agent + verification, after


def test_a_sample_s_disk_and_inodes_are_bounded_together_and_the_next_sample_starts_empty(disk_kind, tmp_path):
    (size,), outputs, after = asyncio.run(_disk_samples(settings(disk_kind, tmp_path, limits=DISK)))
    _, fill, many, half, other_half = outputs
    assert size <= DISK.max_disk_mb * 1024 * 1024  # the workspace is on a disk of its own
    assert "No space left on device" in fill.output and int(fill.output.split()[-1]) < 16 * 2**20, fill
    assert 900 < int(many.output.split()[-1]) < 1024, many  # the inodes ran out, not the loop
    assert half.output == "done\n" and half.exit_code == 0  # the verification writes as any command
    assert "No space left on device" in other_half.output and int(other_half.output.split()[-1]) < 7_500_000
    listing, honest = after
    assert "left.txt" not in listing.output and "half" not in listing.output  # nothing of the first sample
    assert honest.output == "3000\n" or int(honest.output) > 900, honest  # a fresh disk's inodes again


# Two samples open at once in one worker (a process of its own: mkfs.ext4 is found on its PATH at import),
# each bounded to 16 MB, running the commands of argv[3] together, then the template files of the run found
# in the temporary folder. argv[4]: "exit" (the worker ends as asked) or "kill" (no atexit).
TWO_AT_ONCE = """
import asyncio, glob, json, os, signal, sys, tempfile
from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.environments.limits import Limits
kind, run_dir, commands, how = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
settings = EnvironmentSettings(kind=kind, command_timeout=20.0, run_dir=run_dir, limits=Limits(max_disk_mb=16))
async def sample(env):
    try:
        size = os.statvfs(env.workspace)
        image = os.stat(os.path.join(env.disk.folder, "image"))
        outputs = [(await env.exec(command)).output for command in commands]
        return [size.f_blocks * size.f_frsize, oct(image.st_mode & 0o777), env.disk.folder, *outputs]
    finally:
        await env.close()
async def main():
    plugins.load()  # the built-in backends, as a run registers them
    backend = backend_for(settings)
    first, second = await backend.open({}), await backend.open({})
    where = f"batch-runner-{settings.run_tag}-disk-template-*"
    return [*await asyncio.gather(sample(first), sample(second)), glob.glob(os.path.join(tempfile.gettempdir(), where))]
print(json.dumps(asyncio.run(main())), flush=True)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_worker_runs_mkfs_once_and_its_further_disks_are_bounded_empty_copies(disk_kind, how, tmp_path):
    """mkfs.ext4 (a process, ~6 ms of CPU, which opens every loop device of the host) ran for each image:
    now once per worker, run and size, on a template never mounted; a second disk of the size made while
    the first is in use is a copy of it, bounded and empty as the first. The template is kept in the
    worker's memory, its file gone at once (review 8: a local command, root, wrote into the template file
    with debugfs, and every later disk of the worker held its file): none lies in the temporary folder while
    the samples run, and what a killed worker leaves the run's remove_leftovers removes."""
    calls = tmp_path / "mkfs-calls"
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    wrapper = bin_folder / "mkfs.ext4"  # the real one, each call counted
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {disk.MKFS} "$@"\n')
    wrapper.chmod(0o755)
    run_dir = str(tmp_path / "run")
    liveness.hold(EnvironmentSettings(run_dir=run_dir))  # what the killed worker left stays for this test to see
    environ = {**os.environ, "PATH": f"{bin_folder}:{os.environ['PATH']}"}
    commands = json.dumps(["ls -A | grep -vx .tmp | wc -l", FILL.format(where="."), "rm big; " + MANY_FILES])
    args = [sys.executable, "-c", TWO_AT_ONCE, disk_kind, run_dir, commands, how]
    done = subprocess.run(args, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)
    assert done.stderr == "", done.stderr
    *samples, templates = json.loads(done.stdout)
    made = calls.read_text().splitlines()
    assert len(made) == 1, made  # the template's: not one per disk
    assert templates == []  # no template file for a sample's command to write into
    assert samples[0][2] != samples[1][2]  # two disks, both in use at once
    for size, mode, _, listed, fill, many in samples:
        assert size <= DISK.max_disk_mb * 1024 * 1024 and mode == "0o600"
        assert listed == "0\n"  # each starts empty (local's TMPDIR, .tmp, aside)
        assert "No space left on device" in fill and int(fill.split()[-1]) < 16 * 2**20, fill
        assert 900 < int(many.split()[-1]) < 1024, many  # the inodes of a mkfs'd disk of the size
    settings = EnvironmentSettings(kind=disk_kind, run_dir=run_dir, limits=DISK)
    left = glob.glob(os.path.join(tempfile.gettempdir(), glob.escape(workspace_prefix(settings)) + "*"))
    if how != "kill" or disk_kind == "local":  # its images went at the worker's end (local's with their samples)
        assert left == []
        return
    assert any("-disk-" in folder for folder in left), left
    backend_class(disk_kind).remove_leftovers(settings)
    assert glob.glob(os.path.join(tempfile.gettempdir(), glob.escape(workspace_prefix(settings)) + "*")) == []


# A worker taking one disk once a line comes on its stdin (it says "ready" first); argv[2] "give back": it gives
# the disk back and ends.
TAKES_A_DISK = """
import os, sys
from trajforge.environments import EnvironmentSettings, disk
from trajforge.environments.limits import Limits
from trajforge.environments.local import workspace_prefix
settings = EnvironmentSettings(kind="bwrap", run_dir=sys.argv[1], limits=Limits(max_disk_mb=16))
print("ready", flush=True)
sys.stdin.readline()
taken = disk.take(settings, workspace_prefix(settings))
if sys.argv[2] == "list":
    print(" ".join(sorted(os.listdir(taken.root))), flush=True)
if sys.argv[2] != "keep":
    disk.give_back(taken, settings)
"""


def _traced(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        return any(line.split() != ["TracerPid:", "0"] for line in status if line.startswith("TracerPid:"))


def _loop_devices_of(prefix: str) -> list[str]:
    """The loop devices bound to a file whose path starts with `prefix` (an image of a run's disk)."""
    found = []
    for backing in glob.glob("/sys/block/loop*/loop/backing_file"):
        with contextlib.suppress(OSError), open(backing) as handle:
            if handle.read().startswith(prefix):
                found.append(backing.split("/")[3])
    return found


@pytest.mark.parametrize("how", ["killed while it binds its loop device", "given back"])
def test_a_worker_killed_while_it_mounts_a_disk_leaves_no_loop_device(how, tmp_path):
    """(review 16) A disk's loop device was bound to its image in one ioctl and told to free itself with its
    last user (autoclear) in the next: a worker killed between the two (a run's SIGKILL, the OOM killer) left
    the device bound to its deleted image for the host's life, no mount for remove_leftovers to find (seven
    such on the review's host). Bound and flagged in one step now (LOOP_CONFIGURE), the device goes with the
    killed worker. The window is widened here by strace delaying each ioctl the worker makes to take its
    disk; the twin takes its disk and gives it back, and none is left either."""
    if not disk.possible() or not shutil.which("strace"):
        pytest.skip("needs the host's root, mkfs.ext4, loop devices and strace")
    run = EnvironmentSettings(kind="bwrap", run_dir=str(tmp_path / "run"), limits=Limits(max_disk_mb=16))
    prefix = os.path.join(tempfile.gettempdir(), workspace_prefix(run))
    verb = "give back" if how == "given back" else "keep"
    args = [sys.executable, "-c", TAKES_A_DISK, run.run_dir, verb]
    worker = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline() == "ready\n"
    delay = ["strace", "-o", "/dev/null", "-e", "trace=ioctl", "-e", "inject=ioctl:delay_exit=1000000"]
    tracer = subprocess.Popen([*delay, "-p", str(worker.pid)], stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _traced(worker.pid), 30, "strace attached")
        worker.stdin.write("take\n")
        worker.stdin.flush()
        if how != "given back":
            wait_for(lambda: _loop_devices_of(prefix), 60, "the worker's loop device")
            worker.kill()  # in the image's mount: bound, the mount not yet made
        worker.communicate(timeout=60)
        assert worker.returncode == (0 if how == "given back" else -9)
        wait_for(lambda: not _loop_devices_of(prefix), 5, "no loop device bound to the run's images")
    finally:
        worker.kill()
        worker.communicate()
        tracer.wait(timeout=30)
        backend_class("bwrap").remove_leftovers(run)  # its images' devices, each held from its check (loops.let_go)


def test_a_loop_device_another_binder_holds_a_while_is_waited_for_not_a_failed_sample(tmp_path):
    """The kernel names the lowest unbound loop device free also while another binder holds it, claimed and
    unbound (a binding writes its backing file's dirty pages out then): every other binder is told EBUSY
    meanwhile. Three processes of 16 threads making disks failed a few disks in 1000 ("no free loop device"):
    100 attempts at once were used up within one binding. Here the free device is held so (an exclusive open)
    for half a second while a worker takes its disk: it waits and takes it."""
    if not disk.possible():
        pytest.skip("needs the host's root, mkfs.ext4 and loop devices")
    run = EnvironmentSettings(kind="bwrap", run_dir=str(tmp_path / "run"), limits=Limits(max_disk_mb=16))
    args = [sys.executable, "-c", TAKES_A_DISK, run.run_dir, "give back"]
    worker = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline() == "ready\n"
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            free = fcntl.ioctl(control, loops.LOOP_CTL_GET_FREE)
        finally:
            os.close(control)
        held = os.open(f"/dev/loop{free}", os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)  # as a binder half way
        threading.Timer(0.5, os.close, [held]).start()
        worker.stdin.write("take\n")
        worker.stdin.flush()
        assert worker.communicate(timeout=60)[0] == "" and worker.returncode == 0
    finally:
        worker.kill()
        worker.communicate()
        backend_class("bwrap").remove_leftovers(run)


@pytest.mark.parametrize("cover", ["node", "descriptors", None])
def test_a_loop_device_node_swapped_after_binding_mounts_the_sample_s_image_not_what_the_node_is_now(cover, tmp_path):
    """A root local command may put another node at /dev/loopN (its mount namespace is the host's). The disk was
    mounted through that path after the binding, so a node swapped meanwhile mounted another device as the
    sample's disk: here another loop device's, holding a file `elsewhere` (it could be the host's own disk).
    It is mounted through the descriptor of the device as bound now, its node checked against sysfs when
    opened. That descriptor's path lies in /proc, which such a command may mount over as well (the worker's
    /proc/PID/fd, each link to the other device's node): the device mounted is checked to be the one bound, and
    the disk fails. The worker runs in a mount namespace of its own, strace delaying its mount by 3 s, and the
    node or its descriptors are covered there meanwhile; the twin's are left as they are."""
    if not disk.possible() or not shutil.which("strace") or not shutil.which("unshare"):
        pytest.skip("needs the host's root, mkfs.ext4, loop devices, strace and unshare")
    other, content = tmp_path / "other.img", tmp_path / "content"
    content.mkdir()
    (content / "elsewhere").write_text("another device\n")
    subprocess.run(["mkfs.ext4", "-q", "-d", content, other, "4M"], check=True, capture_output=True)
    device = subprocess.run(["losetup", "-f", "--show", other], check=True, capture_output=True, text=True)
    other_loop = device.stdout.strip()
    bound = {other_loop: loop_sequence(other_loop)}
    run = EnvironmentSettings(kind="bwrap", run_dir=str(tmp_path / "run"), limits=Limits(max_disk_mb=16))
    prefix = os.path.join(tempfile.gettempdir(), workspace_prefix(run))
    args = ["unshare", "-m", "--propagation", "private", sys.executable, "-c", TAKES_A_DISK, run.run_dir, "list"]
    worker = subprocess.Popen(
        args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    delay = ["strace", "-o", "/dev/null", "-e", "trace=mount", "-e", "inject=mount:delay_enter=3000000"]
    tracer = subprocess.Popen([*delay, "-p", str(worker.pid)], stderr=subprocess.DEVNULL)
    try:
        assert worker.stdout.readline() == "ready\n"
        wait_for(lambda: _traced(worker.pid), 30, "strace attached")
        worker.stdin.write("take\n")
        worker.stdin.flush()
        wait_for(lambda: _loop_devices_of(prefix), 30, "the worker's loop device")
        nodes = tmp_path / "nodes"
        nodes.mkdir()
        covers = {  # in the worker's namespace alone: the other device's node bound over /dev/loopN, or linked to
            "node": f"mknod {nodes}/loop b 7 {os.minor(os.stat(other_loop).st_rdev)}"
            f" && mount --bind {nodes}/loop /dev/{_loop_devices_of(prefix)[0]}",
            "descriptors": f"for fd in $(seq 0 99); do ln -s {other_loop} {nodes}/$fd; done"
            f" && mount --bind {nodes} /proc/{worker.pid}/fd",
        }
        if cover:
            cover_it = f"mount -t tmpfs none {nodes} && {covers[cover]}"
            subprocess.run(["nsenter", "-t", str(worker.pid), "-m", "sh", "-c", cover_it], check=True)
        listed, failed = worker.communicate(timeout=60)
        if cover == "descriptors":
            assert worker.returncode and "not the disk's" in failed and not listed, (listed, failed)
        else:
            assert worker.returncode == 0 and listed.split() == ["lost+found"], (listed, failed)
    finally:
        worker.kill()
        worker.communicate()
        tracer.wait(timeout=30)
        detach_as_bound(bound)
        backend_class("bwrap").remove_leftovers(run)


# A worker opening the loop device argv[1] (loops.opened) once a line comes on its stdin (it says "ready" first): it
# prints the device number it has open, or why it was refused.
OPENS_A_LOOP = """
import os, sys
from trajforge.environments import loops
print("ready", flush=True)
sys.stdin.readline()
try:
    with loops.opened(sys.argv[1]) as fd:
        print(os.fstat(fd).st_rdev, flush=True)
except OSError as exc:
    print("refused:", exc, flush=True)
"""


@pytest.mark.parametrize("covered", ["device", "fifo", ""])
def test_a_loop_device_s_node_opened_again_through_covered_descriptors_is_refused(covered, tmp_path):
    """loops.opened checks a node through a descriptor of it (O_PATH) and opens it again through /proc/self/fd: a
    root local command may mount a folder of links over the runner's /proc/PID/fd (its mount namespace is the
    host's), each to another device's node, which was opened and used in the node's place (detached at a run's
    end, say), or to a FIFO, whose opening waited for a writer for good (the run's end never ended: review 42). It
    is refused; the twin, its descriptors left as they are, opens the device asked for. The worker
    runs in a mount namespace of its own, where the folder is mounted."""
    if not disk.possible() or not shutil.which("unshare"):
        pytest.skip("needs the host's root, loop devices and unshare")
    devices: dict[str, str] = {}
    try:
        for name in ("asked", "other"):
            subprocess.run(["truncate", "-s", "1M", tmp_path / name], check=True)
            bound = subprocess.run(["losetup", "-f", "--show", tmp_path / name], capture_output=True, text=True)
            devices[bound.stdout.strip()] = loop_sequence(bound.stdout.strip())
        asked, other = devices
        args = [
            "unshare",
            "-m",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            OPENS_A_LOOP,
            os.path.basename(asked),
        ]
        worker = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert worker.stdout.readline() == "ready\n"
        if covered:
            links = tmp_path / "links"
            links.mkdir()
            target = other if covered == "device" else tmp_path / "fifo"
            os.mkfifo(tmp_path / "fifo")
            cover = f"mount -t tmpfs none {links} && for fd in $(seq 0 99); do ln -s {target} {links}/$fd; done"
            cover += f" && mount --bind {links} /proc/{worker.pid}/fd"
            subprocess.run(["nsenter", "-t", str(worker.pid), "-m", "sh", "-c", cover], check=True)
        said = worker.communicate("open\n", timeout=60)[0]
        if covered:
            assert said.startswith("refused:") and "opened as another file" in said, said
        else:
            assert said == f"{os.stat(asked).st_rdev}\n", said
    finally:
        detach_as_bound(devices)


@pytest.mark.parametrize("cover", ["fifo", "sysfs"])
def test_the_loop_control_s_node_is_checked_by_the_kernel_s_fixed_number_not_by_sysfs(cover, tmp_path):
    """The loop control's node is checked before it is opened: a FIFO a root local command put at
    /dev/loop-control (whose opening waits for a writer for good) fails the disk. It is checked by the number the
    kernel fixes for it, not sysfs's, which names it only once the loop module is loaded, which that opening does
    (a host where it was not yet had every disk fail): the twin, /sys/class/misc covered, has its disk. Each in a
    mount namespace of its own."""
    if not disk.possible() or not shutil.which("unshare"):
        pytest.skip("needs the host's root, mkfs.ext4, loop devices and unshare")
    run = EnvironmentSettings(kind="bwrap", run_dir=str(tmp_path / "run"), limits=Limits(max_disk_mb=16))
    covers = {
        "fifo": f"mkfifo {tmp_path}/fifo && mount --bind {tmp_path}/fifo /dev/loop-control",
        "sysfs": "mount -t tmpfs none /sys/class/misc",
    }
    take = f'{covers[cover]} && exec "$0" -c "$1" "$2" list'
    args = ["unshare", "-m", "--propagation", "private", "sh", "-c", take, sys.executable, TAKES_A_DISK, run.run_dir]
    try:
        done = subprocess.run(args, cwd=ROOT, input="take\n", capture_output=True, text=True, timeout=60)
        if cover == "fifo":
            assert done.returncode and "/dev/loop-control is not that device" in done.stderr, done
        else:
            assert done.returncode == 0 and done.stdout.split() == ["ready", "lost+found"], done
    finally:
        backend_class("bwrap").remove_leftovers(run)


def test_a_sample_within_its_disk_works_and_keep_workspaces_keeps_its_files(disk_kind, tmp_path):
    async def scenario():
        env = await backend_for(settings(disk_kind, tmp_path, limits=DISK, keep_workspaces=True)).open({})
        try:
            done = await env.exec("head -c 5000000 /dev/zero > five; mkdir d && echo hi > d/x; wc -c < five")
            image = os.stat(os.path.join(env.disk.folder, "image"))  # the sample's files raw: the runner's alone
        finally:
            await env.close()
        return env.workspace, done, image

    workspace, done, image = asyncio.run(scenario())
    assert done.output == "5000000\n" and (image.st_mode & 0o777, image.st_uid) == (0o600, os.getuid()), image
    try:
        assert (Path(workspace) / "d" / "x").read_text() == "hi\n" and (
            Path(workspace) / "five"
        ).stat().st_size == 5000000
        assert not os.path.ismount(workspace)  # a plain folder now, the disk given back
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def _reserve_files(root: str) -> dict[str, os.stat_result]:
    """The verification's reserve on a disk, as the host sees it (empty when there is none)."""
    folder = os.path.join(root, disk.RESERVE)
    return {name: os.stat(os.path.join(folder, name)) for name in os.listdir(folder)} if os.path.isdir(folder) else {}


def _identity(files: dict[str, os.stat_result]) -> set[tuple]:
    return {(name, info.st_ino, info.st_ctime_ns) for name, info in files.items()}


async def _reserve_samples(env_settings) -> list:
    """Samples of one worker on one disk, in turn: one nobody verifies, one verified whose verification never
    runs (its agent failed), one that fills the disk and is verified, one verified whose verification never
    runs and after whose end the reserve is damaged from outside, one that fills the disk and is verified.
    Each: (the disk's root, the reserve as the agent begins, the outputs, the reserve during the verification)."""
    backend = backend_for(env_settings)
    seen = []
    for verified, verification, damage in (
        (False, False, False),
        (True, False, False),
        (True, True, False),
        (True, False, True),
        (True, True, False),
    ):
        env = await backend.open({})
        try:
            await env.verification_ahead(verified)
            root, files = env.disk.root, _reserve_files(env.disk.root)
            outputs = [await env.exec(FILL.format(where=".") if verification else "echo hi > x")]
            if verification:
                await env.enter_clean_room()
                outputs.append(await env.exec("head -c 500000 /dev/zero > $TMPDIR/half && echo done"))
                files_then = _reserve_files(root)
        finally:
            await env.close()
        seen.append((root, files, outputs, files_then if verification else None))
        if damage:  # kept (bwrap): damaged, not whole
            os.truncate(os.path.join(root, disk.RESERVE, disk.RESERVE_BLOCKS), 0)
    return seen


def test_a_disk_s_reserve_is_kept_until_a_verification_takes_it_and_re_made_when_not_whole(bwrap, tmp_path):  # noqa: F811
    """bwrap's disk goes from one sample of a slot to the next (local's goes with its sample). The
    verification's reserve is made as the agent of a sample that will be verified begins (none for a sample
    nobody verifies: 1 ms of CPU), kept from one sample to the next (not allocated and deleted every
    sample), given back when a verification runs (which writes on a disk the agent filled), made anew for
    the next verified sample, and made anew when it is not whole."""
    warning = disk.unenforced(DISK.max_disk_mb, "bwrap", backend_class("bwrap").LIMITS)
    if warning:
        pytest.skip(warning)
    samples = asyncio.run(_reserve_samples(settings("bwrap", tmp_path, limits=DISK)))
    (
        (root, unverified, out1, _),
        (_, made, _, _),
        (_, kept, full, during),
        (_, remade, _, _),
        (_, repaired, full2, _),
    ) = samples
    assert {sample[0] for sample in samples} == {root}  # one disk, given back and taken again
    assert unverified == {}  # nobody verifies the first sample: no reserve made
    for files in (made, kept, remade, repaired):  # whole as each verified sample's agent begins
        assert sorted(files) == sorted(map(str, range(disk.RESERVE_FILES)))
        assert files[disk.RESERVE_BLOCKS].st_blocks * 512 >= disk.RESERVE_BYTES  # its blocks, in one file
    assert out1[0].exit_code == 0
    assert _identity(kept) == _identity(made)  # kept: the same files, untouched, after a sample without verification
    for fill, verification in (full, full2):  # the agent filled the disk; the verification wrote all the same
        assert "No space left on device" in fill.output, fill
        assert (verification.output, verification.exit_code) == ("done\n", 0), verification
    assert during == {}  # given back to the verification
    assert not _identity(remade) & _identity(kept)  # made anew after the verification that took it
    assert not _identity(repaired) & _identity(remade)  # made anew after it was damaged (a file's blocks gone)


# A file of the disk whose last reference lies in flight on a unix socket cycle (SCM_RIGHTS) once every name
# and process of it is gone: the kernel's unix GC frees it when something triggers a collection, not before.
IN_FLIGHT = (
    "import array, os, socket\n"
    "f = os.open('held', os.O_RDWR | os.O_CREAT); os.unlink('held')\n"
    "try:\n    while True: os.write(f, bytes(1 << 20))\nexcept OSError: pass\n"
    "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [f, a.fileno(), b.fileno()]))]\n"
    "for _ in (1, 2):\n"
    "    for s in (a, b): s.sendmsg([b'x'], fds)\n"
    "print('held')"
)


async def _after_held_file(env_settings, agent: str) -> tuple:
    """A sample nobody verifies runs `agent`; the slot's next sample, verified: its disk and its room."""
    backend = backend_for(env_settings)
    first = await backend.open({})
    try:
        await first.verification_ahead(False)
        done = await first.exec(agent)
        root = first.disk.root
    finally:
        await first.close()
    second = await backend.open({})
    try:
        await second.verification_ahead(True)
        room = os.statvfs(second.workspace)
        return done.output.strip(), root, second.disk.root, room.f_bfree * room.f_frsize
    finally:
        await second.close()


def test_a_bwrap_agent_s_file_held_in_flight_leaves_the_next_sample_neither_less_room_nor_no_reserve(
    bwrap,  # noqa: F811
    tmp_path,
):
    """(review 15) An agent (nobody) filled its disk with a file whose last reference it left in flight on a
    unix socket cycle: every name and process gone, the disk looked empty and went to the slot's next sample,
    whose reserve could not be made (the sample failed: No space left on device) or which had the room the
    file left. A disk given back holding more than its files now is dropped; the twin's disk is kept."""
    warning = disk.unenforced(DISK.max_disk_mb, "bwrap", backend_class("bwrap").LIMITS)
    if warning:
        pytest.skip(warning)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    attack, honest = f"python3 -c {shlex.quote(IN_FLIGHT)}", "head -c 30000000 /dev/zero > x 2>/dev/null; echo held"
    held = asyncio.run(_after_held_file(settings("bwrap", tmp_path / "a", limits=DISK), attack))
    twin = asyncio.run(_after_held_file(settings("bwrap", tmp_path / "b", limits=DISK), honest))
    assert held[0] == twin[0] == "held", (held, twin)
    # The attacked disk is dropped (or, where the kernel's unix GC freed the file meanwhile, given back whole);
    # the twin's is given back.
    assert twin[1] == twin[2], twin
    assert held[3] >= twin[3] - 65536 and twin[3] > (DISK.max_disk_mb - 4) * disk.MB  # the whole disk's room


# What a local agent (the runner, root, which reaches the disk's root, its image and the host's mounts) did
# to its disk so that the next sample on it had a reserve that freed nothing, less room than the disk's, or a
# workspace it could not run its files in: seal the reserve (review 5), mount one of its files over the others,
# keep its files' blocks after they are deleted (loop devices, or mounts made of them: review 8), leave files in
# lost+found (review 6), hide them there under a mount, mount a file system over the disk (review 8), or stack
# the disk on itself with noexec (review 9).
RESERVE_ATTACKS = {
    "immutable folder": "chattr +i {reserve} && echo sealed",
    "append-only files": "chattr +a {reserve}/* && echo sealed",
    "files mounted over": "for i in $(seq 1 31); do mount --bind {reserve}/0 {reserve}/$i || exit; done; echo sealed",
    "files kept by loop devices": "for f in {reserve}/*; do losetup -f $f 2>/dev/null || exit; done; echo sealed",
    "files kept by mounts": "for i in $(seq 0 31); do touch {pins}/$i; mount --bind {reserve}/$i {pins}/$i || exit; "
    "done; echo sealed",
    "files left in lost+found": "head -c 8000000 /dev/zero > {root}/lost+found/x && echo sealed",
    "files hidden in lost+found": "head -c 8000000 /dev/zero > {root}/lost+found/x && mount -t tmpfs none "
    "{root}/lost+found && echo sealed",
    "the disk mounted on itself noexec": "mount --bind {root} {root} && mount -o remount,bind,noexec {root} && "
    "echo sealed",
    "a file system over the disk": "mount -t tmpfs none {root} && mkdir {root}/lost+found && echo sealed",
}


@pytest.mark.parametrize("attack", RESERVE_ATTACKS)
def test_a_local_agent_leaves_the_next_sample_its_whole_disk_and_reserve(attack, tmp_path):
    """(reviews 5, 6, 8, 9) local's commands run as the runner, which reaches the disk's root: an agent left
    the next sample on its disk a reserve that looked whole and freed nothing for its verification on a disk
    it filled ('No space left on device'), less room than the disk's, or a workspace mounted noexec. Checks
    of a disk given back met each attack in turn and missed the next; now a local sample's disk goes with it
    and the next sample has one of its own, whatever the agent did. The twin's first agent does none of it;
    its second sample writes a script and runs it, and fills its disk to the full size."""
    warning = disk.unenforced(DISK.max_disk_mb, "local", backend_class("local").LIMITS)
    if warning:
        pytest.skip(warning)
    roots, pins = [], tmp_path / "pins"
    pins.mkdir()
    runs = {run: settings("local", tmp_path / run, limits=DISK) for run in ("attacked", "twin")}

    async def samples(first: str, run: str) -> list:  # each in a run of its own: none takes the other's disks
        (tmp_path / run).mkdir()
        backend, seen = backend_for(runs[run]), []
        for agent in (first, "printf 'echo ran' > run.sh && chmod +x run.sh && ./run.sh; " + FILL.format(where=".")):
            env = await backend.open({})
            try:
                await env.verification_ahead(True)  # each verified, as the pipeline says: its reserve made
                roots.append(env.disk.root)
                where = {"reserve": os.path.join(env.disk.root, disk.RESERVE), "root": env.disk.root, "pins": pins}
                seen.append(
                    await env.exec(agent.format(**{key: shlex.quote(str(path)) for key, path in where.items()}))
                )
                if agent != first:
                    await env.enter_clean_room()
                    seen.append(await env.exec("head -c 500000 /dev/zero > $TMPDIR/half && echo done"))
            finally:
                await env.close()
        return seen

    try:
        attacked = asyncio.run(samples(RESERVE_ATTACKS[attack], "attacked"))
        twin = asyncio.run(samples("echo hi > x", "twin"))
    finally:
        _undo(roots, pins, list(runs.values()))
    assert attacked[0].output == "sealed\n" and "No space left on device" in attacked[1].output, attacked
    assert [(done.output, done.exit_code) for done in (attacked[2], twin[2])] == [("done\n", 0)] * 2, (attacked, twin)
    assert int(attacked[1].output.split()[-1]) >= int(twin[1].output.split()[-1]) - 65536  # the whole disk's room
    assert [done.output.split()[0] for done in (attacked[1], twin[1])] == ["ran"] * 2, (attacked, twin)
    assert len(set(roots)) == len(roots)  # a disk of its own for every local sample


def _undo(roots: list[str], pins: Path, runs: list[EnvironmentSettings]) -> None:
    """What the attacks above left on the host: attributes, mounts, and the loop devices of files on the disks,
    which each run's end lets go of (remove_leftovers; a device number matched in `losetup -a` may be another
    test's since, its disk gone and the number taken again)."""
    for root in roots:
        subprocess.run(["chattr", "-R", "-i", "-a", os.path.join(root, disk.RESERVE)], capture_output=True)
    for point in [*sorted(map(str, pins.iterdir())), *roots]:
        subprocess.run(["umount", "-l", point], capture_output=True)
    for run in runs:
        backend_class("local").remove_leftovers(run)


DEEP = "for i in $(seq 1 1200); do mkdir d && cd d || exit; done; echo deep"


@pytest.mark.parametrize("descriptors", [0, 512], ids=["the runner's", "512 descriptors"])
@pytest.mark.parametrize("bounded", [True, False], ids=["disk", "no disk"])
def test_a_tree_too_deep_for_rmtree_goes_with_its_sample(disk_kind, bounded, descriptors, tmp_path):
    """(reviews 9, 10) shutil.rmtree recurses once per folder level, a descriptor held per level: an agent's
    tree 1,200 folders deep raised RecursionError through its ignore_errors at the sample's end, which failed
    it as a crash (run again by every --resume) and left its disk mounted with its data, or its workspace in
    /tmp, until the run's end; under a common descriptor limit rmtree met EMFILE first, which ignore_errors
    hid, and the tree stayed. The tree goes with its sample now, and the next sample of the slot starts empty."""
    limits = Limits(max_disk_mb=64 if bounded else 0)  # 4,096 inodes: room for the 1,200 folders

    async def samples() -> tuple:
        backend = backend_for(settings(disk_kind, tmp_path, limits=limits))
        first = await backend.open({})
        try:
            deep = await first.exec(DEEP)
        finally:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors or soft, hard))  # for the sample's end alone
            try:
                await first.close()
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        second = await backend.open({})
        try:
            return deep, await second.exec("ls -A | grep -vx .tmp | wc -l"), first.workspace
        finally:
            await second.close()

    deep, listed, workspace = asyncio.run(samples())
    assert (deep.output, listed.output) == ("deep\n", "0\n"), (deep, listed)
    assert not os.path.exists(workspace) or not os.listdir(workspace)  # its name is the next sample's


NOBODY = 65534
FOUND_A = 'test -n "$(find "$TESTS_DIR" -name a.txt)" && echo 1 || echo 0'


def test_a_tree_as_deep_as_can_be_read_is_given_to_the_verifier(bwrap, run):  # noqa: F811
    """(review 10) A root runner gives the hidden tests to the verifier's uid (and a sample's fresh folders to
    nobody) with os.walk, and writes them with os.makedirs: both recurse once per folder level (Python 3.11).
    A dataset's tests folder as deep as its owner's read goes (that read starts afresh in a helper process)
    failed its verification with 'RecursionError: maximum recursion depth exceeded'. Both walk without
    recursion now: that sample, whose agent also left trees 1,200 deep in its workspace and /tmp, is
    verified and passes, as does its honest twin, and nothing of either stays in /tmp."""
    home = Path(tempfile.mkdtemp(prefix="nobody-data-", dir="/tmp"))  # its owner's read: nobody's
    try:
        agent = DEEP.replace("echo deep", "cd /tmp && " + DEEP)
        samples = (("deep", agent, "tests"), ("twin", "echo hi > a", {"a.txt": "x\n"}))
        entries = [
            {"prompt": f"{name} [mock command={quote(command, safe='')}]", "verify": FOUND_A, "tests": tests}
            for name, command, tests in samples
        ]
        (home / "data.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in entries))
        (home / "tests").mkdir()
        home.chmod(0o755)
        for path in (home, home / "tests", home / "data.jsonl"):
            os.chown(path, NOBODY, NOBODY)
        folders = HostFolders.of(home / "data.jsonl")
        fd = deepest_readable(home / "tests", lambda: not folders.unreadable(["tests"]))
        try:
            with open(os.open("a.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as handle:
                handle.write("x\n")
            os.chown("a.txt", NOBODY, NOBODY, dir_fd=fd)
        finally:
            os.close(fd)
        result = run(home / "data.jsonl", "--distribution=terminal_only", "--environment=bwrap", "--num_workers=1")
        prefix = workspace_prefix(EnvironmentSettings(run_dir=str(result.run_dir.resolve())))
        left = glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), glob.escape(prefix) + "*"))
        for folder in left:
            remove_tree(folder)
        assert result.code == 0 and not result.jsonl("errors.jsonl"), result.stdout + result.stderr
        verified = {source(row)["prompt"].split()[0]: row["metadata"]["verification"] for row in result.trajectories}
        assert [verified[name]["passed"] for name in ("deep", "twin")] == [True, True], verified
        assert left == []
    finally:
        remove_tree(str(home))


# A runner that is not root: nobody, with the one capability to read this machine's Python (under /root, 0700).
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] + [
    f"--{which}-caps=+dac_read_search" for which in ("inh", "ambient")
]


def test_a_folder_an_agent_closed_goes_with_a_runner_that_is_not_root(server):
    """(review 10) A runner that is not root, on --environment=local: an agent's `chmod 000 d` over d/e/f left
    a folder the runner could neither list nor empty (rmtree and `rm -rf` both stopped there), so the sample's
    workspace stayed in /tmp after the run. Its own folders are made u+rwx and removed now, a link among them
    not followed (the runner's folder it points to keeps its mode); the honest twin, the same tree left open,
    goes as before."""
    home = Path(tempfile.mkdtemp(prefix="nobody-run-", dir="/tmp"))  # the run's files: nobody's
    (home / "outside").mkdir(mode=0o500)  # a folder of the runner's a link points to: never changed
    closed = f"mkdir -p d/e && touch d/e/f && ln -s {home / 'outside'} d/e/link && chmod 000 d"
    commands = {"closed": closed, "twin": "mkdir -p d/e && touch d/e/f"}
    entries = [{"prompt": f"{name} [mock command={quote(command, safe='')}]"} for name, command in commands.items()]
    argv = Runner(home, server).command(write_dataset(home / "data.jsonl", entries), "--environment=local")
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(home)], check=True)
    argv = [*AS_NOBODY, *argv, "--distribution=terminal_only", "--num_workers=1"]
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    try:
        done = subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=120)
        prefix = workspace_prefix(EnvironmentSettings(run_dir=str(home / "out" / "run")))
        left = glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), glob.escape(prefix) + "*"))
        for folder in left:
            remove_tree(folder)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = [json.loads(line) for line in (home / "out" / "run" / "trajectories.jsonl").read_text().splitlines()]
        assert sorted(source(row)["prompt"].split()[0] for row in rows) == ["closed", "twin"]
        assert left == [] and stat.S_IMODE((home / "outside").stat().st_mode) == 0o500
    finally:
        remove_tree(str(home))


def test_a_kept_workspace_with_a_fifo_is_kept_and_its_disk_given_back(disk_kind, run):
    """--keep_workspaces copied a finished sample's workspace off its disk with copytree, which raised on a
    FIFO: the sample failed (crash_Error, again on every --resume) and its disk, the agent's files on it,
    stayed in /tmp after the run. Files, folders and links are copied (a FIFO, socket or device is not),
    and the disk is given back whatever happens. Its twin holds no FIFO."""
    commands = {"fifo": "mkfifo pipe; head -c 20000000 /dev/zero > big; echo done", "twin": "echo hi > a"}
    entries = [{"prompt": f"{name} [mock command={quote(command, safe='')}]"} for name, command in commands.items()]
    flags = ("--distribution=terminal_only", f"--environment={disk_kind}", "--max_disk_mb=64", "--num_workers=1")
    result = run(entries, *flags, "--keep_workspaces")  # a process: its free disks go when it ends
    prefix = workspace_prefix(EnvironmentSettings(run_dir=str(result.run_dir.resolve())))
    left = glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), glob.escape(prefix) + "*"))
    try:
        assert result.code == 0 and not result.jsonl("errors.jsonl"), result.stdout + result.stderr
        assert sorted(source(row)["prompt"].split()[0] for row in result.trajectories) == ["fifo", "twin"]
        assert [folder for folder in left if "-disk-" in folder] == []  # no image, no mount, after the run
        kept = {name: os.path.join(folder, name) for folder in left for name in os.listdir(folder)}
        assert os.path.getsize(kept["big"]) == 20000000 and Path(kept["a"]).read_text() == "hi\n", kept
        assert "pipe" not in kept and not any(os.path.ismount(folder) for folder in left)
    finally:
        for folder in left:
            shutil.rmtree(folder, ignore_errors=True)


DISK_FULL_TASK = {  # the disk is full: free it. Its setup fills the disk on purpose, and exits 0 on the full disk
    "setup": "head -c 40000000 /dev/zero > junk.log; true",
    "verify": {"command": "test -f done && ! test -e junk.log && echo freed"},
}


def test_a_task_whose_setup_fills_the_disk_is_verified_in_the_room_kept_before_it(disk_kind, run, server):
    """(review 11) The verification's reserve is kept aside as the sample's environment opens, before the
    task's setup: a task whose setup fills the disk for the agent to free runs and is verified on its merits,
    also after a verified sample whose model call failed left its reserve on the slot's disk (bwrap), and
    whatever checks it (a command, or one that runs none). A sample nobody verifies has no reserve: its
    agent has the whole disk, whatever ran on the slot before."""
    solve = quote("rm junk.log && echo ok > done", safe="")
    entries = [
        {"prompt": "dies [mock fail=400]", "verify": DISK_FULL_TASK["verify"]},  # leaves a kept reserve (bwrap)
        {"prompt": f"frees [mock command={solve}]", **DISK_FULL_TASK},
        {"prompt": "idles [mock command=true]", **DISK_FULL_TASK},  # its twin: it frees nothing
        {"prompt": "uses terminal [mock command=true]", **DISK_FULL_TASK, "verify": {"tools_called": ["terminal"]}},
        {"prompt": f"unverified [mock command={quote('df -k . | tail -1', safe='')}]"},
    ]
    flags = ("--distribution=terminal_only", f"--environment={disk_kind}", "--max_disk_mb=16", "--num_workers=1")
    result = run(entries, *flags, batch_size=1)
    assert result.code == 4, result.stdout + result.stderr  # the model call that failed for good (a 400)
    assert [error["error_type"] for error in result.jsonl("errors.jsonl")] == ["api_http_400"]
    verdicts = {source(row)["prompt"].split()[0]: row["metadata"]["verification"] for row in result.trajectories}
    assert verdicts["frees"]["passed"] is True and verdicts["idles"]["passed"] is False, verdicts
    assert verdicts["uses"]["passed"] is True, verdicts
    unverified = next(row for row in result.trajectories if source(row)["prompt"].startswith("unverified"))
    free_kb = int(re.findall(r"(\d+)\s+\d+%", tool_results(unverified))[-1])  # df's "Available" of its disk
    assert free_kb > 15 * 1024, tool_results(unverified)  # no reserve: 15.4 MB free of 16 (with one: 14.4)


KEEP_ATTACK = (
    "cp /bin/sh suid && chmod 4755 suid && cp /bin/sh sgid && chmod 6755 sgid && mkdir -m 3777 sticky && "
    "truncate -s 300M sparse && head -c 20000000 /dev/zero > big && ln big big2 && mkdir d && ln big d/big3 && "
    "ls -ln"
)
KEEP_TWIN = "echo hi > a && chmod 640 a && echo true > run.sh && chmod 755 run.sh && mkdir t && ln -s ../a t/l"


def test_a_kept_workspace_gives_the_host_no_more_than_its_disk_held(disk_kind, run):
    """--keep_workspaces copied a workspace off its disk with copytree, as root onto the host's /tmp: a
    setuid or setgid file the agent made became root's and kept its bit (-rwsr-xr-x root: a setuid root
    shell on the host), a sparse file of 300 MB on a 64 MB disk took 300 MB of the host, and each hard link
    of a file a copy of its own. Now each copy is its source's owner with its permission bits alone, holes
    stay holes, links one file. Its twin's files are kept as they were."""
    commands = {"attack": KEEP_ATTACK, "twin": KEEP_TWIN}
    entries = [{"prompt": f"{name} [mock command={quote(command, safe='')}]"} for name, command in commands.items()]
    flags = ("--distribution=terminal_only", f"--environment={disk_kind}", "--max_disk_mb=64", "--num_workers=1")
    result = run(entries, *flags, "--keep_workspaces")
    prefix = workspace_prefix(EnvironmentSettings(run_dir=str(result.run_dir.resolve())))
    left = glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), glob.escape(prefix) + "*"))
    owner = host_user() if disk_kind == "bwrap" else os.getuid()  # the agent's files' owner on the host
    try:
        assert result.code == 0 and not result.jsonl("errors.jsonl"), result.stdout + result.stderr
        assert "left out" not in result.stderr, result.stderr
        kept = {name: os.path.join(folder, name) for folder in left for name in os.listdir(folder)}
        seen = {name: os.lstat(path) for name, path in kept.items()}
        for name in ("suid", "sgid", "sticky"):  # no setuid, setgid or sticky bit, and the agent's, not root's
            assert stat.S_IMODE(seen[name].st_mode) == (0o777 if name == "sticky" else 0o755), (name, seen[name])
            assert (seen[name].st_uid, seen[name].st_gid) == (owner, owner), (name, seen[name])
        assert seen["sparse"].st_size == 300 * 2**20 and seen["sparse"].st_blocks < 64, seen["sparse"]
        assert seen["big"].st_size == 20000000 and seen["big"].st_nlink == 3, seen["big"]
        linked = {seen["big2"].st_ino, os.stat(os.path.join(kept["d"], "big3")).st_ino}
        assert linked == {seen["big"].st_ino}
        assert Path(kept["a"]).read_text() == "hi\n" and stat.S_IMODE(seen["a"].st_mode) == 0o640
        assert stat.S_IMODE(seen["run.sh"].st_mode) == 0o755 and seen["a"].st_uid == owner
        assert os.readlink(os.path.join(kept["t"], "l")) == "../a" and Path(kept["t"], "l").read_text() == "hi\n"
        for folder in left:  # the kept folder itself: the runner's alone, as it was made
            assert (os.stat(folder).st_uid, stat.S_IMODE(os.stat(folder).st_mode)) == (os.getuid(), 0o700)
    finally:
        for folder in left:
            shutil.rmtree(folder, ignore_errors=True)


def test_a_kept_copy_stops_at_its_disk_s_size_and_leaves_out_another_file_system_and_says_so(tmp_path):
    """The data a copy off a disk writes stops at the disk's size, whatever its folders reach (here the disk of
    1 MB bound again below itself, which holds 700 KB: 1.4 MB): the rest is left out and said in the notes the run
    prints, what was copied kept. What lies on another file system (a host folder bound there) is left out, and
    said so too: it is none of the sample's files. Their twin: the same disk without the mount, copied whole, no
    note."""
    if not tmpfs.possible():
        pytest.skip("mounting needs the host's root")
    host = tmp_path / "host"
    host.mkdir()
    (host / "big").write_bytes(b"x" * 3 * 2**20)
    copies = {}
    for case in ("itself", "outside", "twin"):
        source, target = tmp_path / case, tmp_path / f"{case}-kept"
        source.mkdir()
        target.mkdir(mode=0o700)
        assert tmpfs.mount(str(source), 1, None)
        try:
            (source / "a").write_bytes(b"a" * 1000)
            (source / "big").write_bytes(b"b" * 700 * 2**10)
            (source / "m").mkdir()
            (source / "z").write_text("z")
            if case != "twin":
                subprocess.run(["mount", "--bind", str(source if case == "itself" else host), str(source / "m")])
            try:
                disk.copy_files(str(source), str(target), os.stat(source).st_dev)
            finally:
                tmpfs.unmount(str(source / "m"))
        finally:
            tmpfs.unmount(str(source))
        copies[case] = (sorted(str(path.relative_to(target)) for path in target.rglob("*")), disk.take_notes())
    files, notes = copies["itself"]
    assert files == ["a", "big", "m", "m/a"] and (tmp_path / "itself-kept" / "big").stat().st_size == 700 * 2**10
    assert notes == [
        f"--keep_workspaces: 4 entries of the workspace kept in {tmp_path / 'itself-kept'} left out: "
        "their data passed the size of the sample's disk (--max_disk_mb)"
    ], notes
    assert copies["outside"] == (
        ["a", "big", "z"],
        [f"--keep_workspaces: 1 entries of the workspace kept in {tmp_path / 'outside-kept'} left out: not copied"],
    )
    assert copies["twin"] == (["a", "big", "m", "z"], [])


async def _tmp_on_disk(env_settings) -> list:
    """A sample filling its /tmp, then writing to its workspace and in its clean room; and an honest one."""
    backend = backend_for(env_settings)
    size = "df -P \"$TMPDIR\" | tail -1 | awk '{print $2}'"  # KB of the file system under $TMPDIR
    outputs = []
    for commands in (
        [size, FILL.format(where="$TMPDIR"), "head -c 3000000 /dev/zero > here; wc -c < here"],
        [size, "head -c 5000000 /dev/zero > $TMPDIR/5; head -c 5000000 /dev/zero > 5; cat $TMPDIR/5 5 | wc -c"],
    ):
        env = await backend.open({})
        try:
            outputs.append([await env.exec(command) for command in commands])
            await env.enter_clean_room()
            outputs[-1].append(await env.exec(FILL.format(where="$TMPDIR")))
        finally:
            await env.close()
    return outputs


def test_a_sample_s_tmp_lies_on_its_disk_whatever_the_file_size_limit(disk_kind, tmp_path):
    # No file size limit: no tmpfs of that size holds bwrap's /tmp, yet the host's disk must not either.
    attack, honest = asyncio.run(_tmp_on_disk(settings(disk_kind, tmp_path, limits=replace(DISK, max_file_size_mb=0))))
    size, fill, workspace, clean_room = attack
    assert int(size.output) <= DISK.max_disk_mb * 1024, size  # $TMPDIR is on the sample's 16 MB disk
    assert "No space left on device" in fill.output and int(fill.output.split()[-1]) < 16 * 2**20, fill
    assert "No space left on device" in workspace.output, workspace  # the same disk: the workspace is full too
    assert "No space left on device" in clean_room.output and int(clean_room.output.split()[-1]) < 16 * 2**20
    size, both, clean_room = honest
    assert int(size.output) <= DISK.max_disk_mb * 1024 and both.output == "10000000\n", both
    assert "No space left on device" in clean_room.output  # what the agent left (10 MB) counts in the clean room


FDS = "ls -l /proc/$$/fd"  # the command's shell's descriptors, in no pipeline (its own pipe would show)
BWRAP_MARK = "2.71828"  # a sleep no other test runs


async def _descriptors(env_settings) -> dict:
    """What descriptors the agent's command, a spawned server and the verification's command hold, with
    the namespaces they run in: the slot's (where the command's bwrap started) and the sample's network."""
    env = await backend_for(env_settings).open({})
    try:
        seen = {"agent": (await env.exec(FDS)).output}
        server = await env.spawn(["sh", "-c", FDS], {})
        seen["server"] = (await server.process.stdout.read()).decode()
        await server.end()
        seen["net"] = (await env.exec("readlink /proc/self/ns/net")).output.strip()
        running = asyncio.create_task(env.exec(f"sleep {BWRAP_MARK}"))
        seen["started_in"] = await asyncio.to_thread(_bwrap_namespace)
        running.cancel()
        seen["slot"] = os.fstat(env.slot.fd).st_ino
        seen["sample_net"] = os.fstat(env.network.fd).st_ino if env.network else None
        await env.enter_clean_room()
        seen["verification"] = (await env.exec(FDS)).output
        return seen
    finally:
        await env.close()


def _bwrap_namespace() -> int:
    """The mount namespace the sleeping command's bwrap was started in, read from the host's /proc: that of
    the outermost bwrap above it (the sample's sandbox: bwrap_session.py)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for path in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if f"sleep {BWRAP_MARK}" in path.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    return os.stat(f"/proc/{_outermost_bwrap(int(path.parent.name))}/ns/mnt").st_ino
        time.sleep(0.02)
    raise AssertionError("the command's bwrap never showed up")


def _outermost_bwrap(pid: int) -> int:
    found = 0
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if handle.read().split(b"\0")[0].endswith(b"bwrap"):
                found = pid
        with open(f"/proc/{pid}/stat") as handle:
            pid = int(handle.read().rsplit(")", 1)[1].split()[1])
    assert found, "no bwrap above the command"
    return found


def test_no_command_inherits_a_namespace_descriptor_yet_each_starts_in_the_slot_s_namespace(bwrap, tmp_path):  # noqa: F811
    if not disk.possible():
        pytest.skip("--max_disk_mb needs the host's root, mkfs.ext4 and loop devices")
    network = os.geteuid() == 0 and netns.missing() is None
    seen = asyncio.run(_descriptors(settings("bwrap", tmp_path, limits=DISK, sandbox_network=network)))
    for who in ("agent", "server", "verification"):  # stdin, stdout and stderr: no mnt:[...], net:[...], user:[...]
        held = [line.split(" -> ")[0].split()[-1] for line in seen[who].splitlines() if " -> " in line]
        assert held == ["0", "1", "2"], (who, seen[who])
    assert seen["started_in"] == seen["slot"]  # the honest twin: bwrap still starts in the slot's namespace
    if network:  # and the command is in the sample's network namespace
        assert seen["net"] == f"net:[{seen['sample_net']}]", seen


NET = "readlink /proc/self/ns/net"
# A server on the loopback for `seconds`, and a client that tries its port every 0.2 s for `seconds`: "open"
# when it got in once, else "closed". As a command's own text: python3 -c 'SCRIPT' ARGS.
SERVE_A_WHILE = (
    "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
    "time.sleep(float(sys.argv[2]))"
)
KNOCK = (
    "import socket, sys, time\n"
    "end = time.monotonic() + float(sys.argv[2])\n"
    "while time.monotonic() < end:\n"
    "    try:\n"
    "        socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=0.2).close()\n"
    "        print('open'); break\n"
    "    except OSError:\n"
    "        time.sleep(0.2)\n"
    "else:\n"
    "    print('closed')\n"
)

# A server that serves one connection of its own client and closes first (its port in TCP's TIME_WAIT after),
# then a bind of that port without SO_REUSEADDR, as Python's socketserver binds.
SERVE_ONE = (
    "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
    "c = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); a, _ = s.accept(); a.close(); c.close(); "
    "s.close(); print('served')"
)
BIND = "import socket, sys; socket.socket().bind(('127.0.0.1', int(sys.argv[1]))); print('bound')"


def _net_descriptors() -> list[str]:
    """The network namespaces this process holds open."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own, closed since
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [target for target in held if target.startswith("net:[")]


async def _loopbacks(env_settings, port: int) -> dict:
    """The network namespaces a root runner's sample's commands run in, and who reaches a server on one
    sample's loopback: the sample's own command, and another sample's in flight meanwhile."""
    backend = backend_for(env_settings)
    first, second = await backend.open({}), await backend.open({})
    try:
        seen = {
            "agent": [(await first.exec(NET)).output.strip() for _ in range(2)],
            "other": (await second.exec(NET)).output.strip(),
        }
        assert first.loopback is not None and first.loopback.fd is not None
        seen["made"] = f"net:[{os.fstat(first.loopback.fd).st_ino}]"
        server = await first.spawn(["sh", "-c", NET], {})
        seen["server"] = (await server.process.stdout.read()).decode().strip()
        await server.end()
        serve, knock = (f"python3 -c {shlex.quote(script)}" for script in (SERVE_A_WHILE, KNOCK))
        own = first.exec(f"{serve} {port} 8 & {knock} {port} 6; wait")  # the honest twin: its own loopback
        others = second.exec(f"sleep 1; {knock} {port} 6")  # the attack: another sample's, while it serves
        seen["own"], seen["others"] = (done.output.strip() for done in await asyncio.gather(own, others))
        serve, bind = (f"python3 -c {shlex.quote(script)} {port + 1}" for script in (SERVE_ONE, BIND))
        seen["again"] = [(await first.exec(command)).output.strip() for command in (serve, bind)]
        await first.enter_clean_room()
        seen["verification"] = (await first.exec(NET)).output.strip()
        return seen
    finally:
        await first.close()
        await second.close()


async def _cancelled_first_commands(env_settings) -> list[str]:
    """The network namespaces this process holds after samples cancelled in their first command closed."""
    backend = backend_for(env_settings)
    for _ in range(3):
        env = await backend.open({})
        try:
            command = asyncio.create_task(env.exec("sleep 5"))
            await asyncio.sleep(0.2)
            command.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await command
        finally:
            await env.close()
    return _net_descriptors()


def test_a_root_runner_s_sample_has_one_loopback_its_agent_s_commands_share_and_no_other_sample_reaches(
    bwrap,  # noqa: F811
    tmp_path,
):
    """Each agent command no longer makes a network namespace of its own (about 1 ms of CPU each): the
    sample's commands join one made for it. What a command reaches stays its sample's: a server on one
    sample's loopback is reached by that sample's command and by no other sample's in flight, and the
    verification and a spawned service still have their own namespace."""
    if host_user() is None:
        pytest.skip("a root runner's commands join the sample's namespace by nsenter: the runner is not root")
    seen = asyncio.run(_loopbacks(settings("bwrap", tmp_path), random.randint(40000, 49999)))
    assert seen["agent"] == [seen["made"]] * 2, seen  # both commands in the one the runner made
    assert seen["other"] != seen["made"] and seen["server"] != seen["made"] and seen["verification"] != seen["made"]
    assert seen["own"] == "open", seen  # its loopback is up
    assert seen["others"] == "closed", seen
    assert seen["again"] == ["served", "bound"], seen  # no TIME_WAIT of an earlier command holds a port (review 14)
    assert asyncio.run(_cancelled_first_commands(settings("bwrap", tmp_path))) == []  # none left open (review 14)


async def _cancelled_opens(env_settings) -> tuple[list[str], list[str]]:
    """The network namespaces and the run's disks this process holds after 10 samples cancelled while their
    environment opened (its hop off the loop running) were closed, as Backend.open closes them."""
    backend = backend_for(env_settings)
    for delay in (0.001, 0.002, 0.004, 0.008, 0.016) * 2:
        opening = asyncio.create_task(backend.open({}))
        await asyncio.sleep(delay)
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await (await opening).close()  # not cancelled in time: closed as a sample closes it
    prefix = os.path.join(tempfile.gettempdir(), workspace_prefix(env_settings))
    with open("/proc/self/mounts") as mounts:
        disks = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    return _net_descriptors(), disks


def test_a_sample_cancelled_while_its_environment_opens_leaves_nothing_open(bwrap, tmp_path):  # noqa: F811
    """(review 15) Backend.open closes an environment whose start was cancelled, but the hop off the loop that
    prepares it ran on: close() ran beside it and missed what it made after, the sample's loopback namespace
    (held for the worker's life: 11 of 20) and its disk (mounted on its loop device after the run: 20 of 20)."""
    if host_user() is None:
        pytest.skip("only a root runner makes a sample's loopback and disk")
    nets, disks = asyncio.run(_cancelled_opens(settings("bwrap", tmp_path, limits=DISK)))
    assert nets == [] and len(disks) <= 1, (nets, disks)  # at most the slot's disk, kept for its next sample


def test_a_process_forked_while_samples_open_and_close_their_loopback_holds_none_of_them():
    """(review 14) A process forked from a worker (the python verifier forks one per finished sample) while
    another thread opened or closed a sample's namespace kept a copy of its descriptor half the time: the
    namespace outlived its sample as long as the child did. Now none is kept, in 300 forks."""
    if host_user() is None:
        pytest.skip("only a root runner makes a sample's loopback")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            loopback.Loopback().open().close()

    maker, kept = threading.Thread(target=churn), 0
    maker.start()
    try:
        for _ in range(300):
            pid = os.fork()
            if pid == 0:
                os._exit(1 if _net_descriptors() else 0)
            kept += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    finally:
        stop.set()
        maker.join()
    assert kept == 0, f"{kept} of 300 forked children kept a sample's network namespace"


def test_hidden_tests_are_written_whatever_room_the_agent_left_on_its_disk(disk_kind, run_here):
    """The agent fills its disk (the workspace, then its /tmp): the hidden tests are written all the same,
    and each verification passes or fails on its merits, naming no folder of the host."""
    fill = "; head -c 40000000 /dev/zero > big; head -c 40000000 /dev/zero > $TMPDIR/big; df -P . | tail -1"
    tests = {"check.sh": "grep -qx 42 answer.txt && echo checked\n"}
    verify = 'sh "$TESTS_DIR/check.sh"'
    entries = [
        {"prompt": f"solved [mock command={quote('echo 42 > answer.txt' + fill, safe='')}]", "tests": tests},
        {"prompt": f"wrong [mock command={quote('echo 41 > answer.txt' + fill, safe='')}]", "tests": tests},
    ]
    flags = ("--distribution=terminal_only", f"--environment={disk_kind}", "--max_disk_mb=16", "--num_workers=1")
    result = run_here([{**entry, "verify": verify} for entry in entries], *flags)
    assert result.code == 0, result.stdout + result.stderr
    rows = {source(row)["prompt"].split()[0]: row for row in result.trajectories}
    for row in rows.values():
        assert " 100% " in tool_results(row), tool_results(row)  # the disk was full
        assert "-disk-" not in json.dumps(row), row["metadata"]["verification"]
    solved, wrong = (rows[name]["metadata"]["verification"] for name in ("solved", "wrong"))
    assert solved["passed"] is True and "checked" in solved["output"], solved
    assert wrong["passed"] is False and not wrong["error"], wrong  # failed by its test, not by the disk


TASK_REPO = (
    "git init -q . && mkdir tests && echo 'grep -qx 42 answer.txt' > tests/check.sh && git add tests"
    " && git -c user.email=a@b -c user.name=a commit -qm task && echo 42 > answer.txt"
)
# 30,000 entries of a file not in the work tree, marked skip-worktree: an index of 8 MB, which git must
# write again to unmark them.
BIG_MARKED_INDEX = (
    " && b=$(git hash-object -w tests/check.sh)"
    " && awk -v b=$b 'BEGIN { for (i = 0; i < 30000; i++) printf \"100644 %s\\tpad/%0200d\\n\", b, i }'"
    " | git update-index --index-info && git ls-files -z pad | git update-index -z --skip-worktree --stdin"
)
TAMPER = " && printf 'true\\n' > tests/check.sh"
FILL_DISK = "; head -c 40000000 /dev/zero > big; df -P . | tail -1"


def test_a_marked_index_the_clean_room_cannot_rewrite_on_a_full_disk_fails_the_verification(disk_kind, run_here):
    """The agent hides its tampered tests/check.sh from git (skip-worktree) in an index of 8 MB and fills its
    disk: the clean room's git could not write the index again (1 MB given back), the marks stayed, the
    scan said nothing (its status its last step's), and `git diff --exit-code` passed over the file:
    reward 1.0. The clean room fails closed now. Twins on a full disk: the same tampering unmarked is seen
    by git diff (failed, no error); an honest solution passes."""
    agents = {
        "hidden": TASK_REPO + BIG_MARKED_INDEX + TAMPER + " && git update-index --skip-worktree tests/check.sh",
        "seen": TASK_REPO + TAMPER,
        "honest": TASK_REPO,
    }
    verify = "git diff --no-ext-diff --no-textconv --exit-code HEAD -- tests/ >/dev/null && sh tests/check.sh"
    entries = [
        {"prompt": f"{name} [mock command={quote(agent + FILL_DISK, safe='')}]", "verify": verify}
        for name, agent in agents.items()
    ]
    flags = ("--distribution=terminal_only", f"--environment={disk_kind}", "--max_disk_mb=32", "--num_workers=1")
    result = run_here(entries, *flags, batch_size=3)
    assert result.code == 0, result.stdout + result.stderr
    rows = {source(row)["prompt"].split()[0]: row for row in result.trajectories}
    assert all(" 100% " in tool_results(row) for row in rows.values())  # each disk was full
    hidden, seen, honest = (rows[name]["metadata"]["verification"] for name in agents)
    assert hidden["passed"] is False and "cannot clean the workspace" in hidden["error"], hidden
    assert (seen["passed"], seen["error"], honest["passed"]) == (False, "", True), (seen, honest)


# A driver that holds a slot's mount namespace (and a sample's network, where pasta is here), as the
# driver does after listing the MCP servers, then forks a worker as the pool does; it prints the pids.
DRIVER = """
import multiprocessing, sys, time
from trajforge.environments import bwrap, mountns, netns
held = [mountns.SlotMounts(mountns.holder_argv(bwrap.system_mounts(), [sys.argv[1]])).open()]
if sys.argv[2] == "network":
    held.append(netns.SampleNetwork().open())
def work(ready):
    ready.set()  # after the fork's hooks: what the worker holds from now on is what it keeps
    time.sleep(120)
fork = multiprocessing.get_context("fork")
ready = fork.Event()
worker = fork.Process(target=work, args=(ready,), daemon=True)
worker.start()
ready.wait(60)
print(worker.pid, *((getattr(h, "holder", None) or h.pasta).pid for h in held), flush=True)
time.sleep(120)
"""


def _descriptors_of(pid: int) -> set[str]:
    found = set()
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            found.add(os.readlink(entry))
    return found


def _alive(pid: int) -> bool:
    """Running: a zombie (this process may be the subreaper that adopted it) has no command line."""
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def test_a_forked_worker_holds_no_holder_s_pipe_and_holders_die_with_a_killed_driver(bwrap, tmp_path):  # noqa: F811
    if not disk.possible():
        pytest.skip("the slot's mount namespace needs the host's root")
    network = "network" if netns.missing() is None else "none"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), network], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    worker, *holders = (int(pid) for pid in driver.stdout.readline().split())
    try:
        pipes = set().union(*(_descriptors_of(pid) for pid in holders))  # their stdin and stdout among them
        held = _descriptors_of(worker)
        assert not {target for target in held if target.startswith(("mnt:", "net:"))}, held
        assert not held & {target for target in pipes if target.startswith("pipe:")}, (held, pipes)
        driver.kill()  # as kill -9 does: no atexit, no close
        driver.wait()
        wait_for(lambda: not any(map(_alive, holders)), 30, "the holders to end")
        assert _alive(worker)  # the honest twin: the worker lives on, and does not keep them
    finally:
        driver.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, 9)


def test_where_the_disk_bound_cannot_hold_the_run_says_so():
    assert disk.unenforced(0, "docker", backend_class("docker").LIMITS) is None
    assert disk.unenforced(10240, "docker", backend_class("docker").LIMITS) == (
        "--max_disk_mb not enforced by --environment=docker: a sample's files are bounded by its own storage"
    )


def test_a_killed_sample_s_kept_workspace_keeps_its_files_on_resume(disk_kind, tmp_path):
    env_settings = settings(disk_kind, tmp_path, limits=DISK, keep_workspaces=True)
    killed = asyncio.run(backend_for(env_settings).open({}))  # never closed, as when its worker is killed
    asyncio.run(killed.exec("mkdir d && echo kept > d/x"))
    prepare_run(env_settings, resume=True)
    try:
        assert not os.path.ismount(killed.workspace)
        assert (Path(killed.workspace) / "d" / "x").read_text() == "kept\n"
    finally:
        prepare_run(replace(env_settings, keep_workspaces=False), resume=True)


@pytest.mark.skipif(not tmpfs.possible(), reason="the run folder's small disk is a tmpfs: the host's root mounts it")
def test_a_run_waits_while_its_folder_s_disk_is_low_and_goes_on_when_there_is_room(run, server):
    out = run.tmp_path / "out"  # the run folder's disk: 64 MB, of which 48 taken
    out.mkdir()
    assert tmpfs.mount(str(out), 64, None)
    try:
        (out / "filler").write_bytes(bytes(48 * 2**20))
        command = run.command([{"prompt": "one"}, {"prompt": "two"}], "--min_free_disk_mb=32", "--environment=local")
        said = run.tmp_path / "stderr"
        warning = f"the run folder's disk ({out / 'run'}) has less than 32 MB free (--min_free_disk_mb)"
        with said.open("w") as stderr_file:
            proc = subprocess.Popen(command, cwd=run.tmp_path, stdout=subprocess.DEVNULL, stderr=stderr_file)
        try:
            wait_for(lambda: warning in said.read_text() or proc.poll() is not None, what="the low-disk warning")
            time.sleep(1)  # a worker that did not wait would send its first request meanwhile
            assert server.attempts["one"] == server.attempts["two"] == 0 and proc.poll() is None, said.read_text()
            (out / "filler").unlink()
            proc.wait(timeout=120)
        finally:
            proc.kill()
        stderr = said.read_text()
        assert proc.returncode == 0, stderr
        assert stderr.count(warning) == 1, stderr
        assert len((out / "run" / "trajectories.jsonl").read_text().splitlines()) == 2
    finally:
        tmpfs.unmount(str(out))


# Runs argv[2:] as root of a user namespace mapping the host's uids 0-65535 one to one, with
# /proc/self/setgroups "deny" (as a runner in a rootless or userns-remapped container), holding the groups argv[1].
USERNS_DENY = r"""import ctypes, os, sys
r, w = os.pipe()
go, ready = os.pipe()
pid = os.fork()
if pid == 0:
    os.setgroups([int(group) for group in sys.argv[1].split(",") if group])
    assert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0
    os.write(w, b"x")
    os.read(go, 1)
    os.execvp(sys.argv[2], sys.argv[2:])
os.read(r, 1)
for name, text in (("setgroups", "deny"), ("uid_map", "0 0 65536"), ("gid_map", "0 0 65536")):
    with open(f"/proc/{pid}/{name}", "w") as handle:
        handle.write(text)
os.write(ready, b"x")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))"""
# bwrap's own check, then --environment=auto's choice: what each says.
CHECK = (
    "from trajforge import plugins; from trajforge.environments import EnvironmentSettings, backend_class, choose; "
    "from trajforge.errors import UsageError; plugins.load()\n"
    "for kind, step in (('bwrap', backend_class('bwrap').check), ('auto', lambda s: choose(s)[0].kind)):\n"
    "    try: print(kind, step(EnvironmentSettings(kind=kind)) or 'bwrap')\n"
    "    except UsageError as exc: print(kind, 'refused:', exc)"
)


def _without_setgroups(script: str) -> dict[str, subprocess.CompletedProcess]:
    """`script` run by a root whose user namespace denies setgroups, with supplementary groups 10 and 20 (key
    "10,20") and without any (key "")."""
    return {
        groups: subprocess.run(
            [sys.executable, "-c", USERNS_DENY, groups, sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for groups in ("10,20", "")
    }


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="maps the host's uids: root, bwrap")
def test_a_root_runner_whose_groups_cannot_be_dropped_is_refused_at_start():
    """(review 5) nsenter's --setgid goes on when setgroups() fails (it checks only when it joins a user
    namespace), so a root runner whose user namespace denies setgroups gave every bwrap command its
    supplementary groups (setpriv --clear-groups had refused to run them). bwrap's check refuses such a
    runner at start, also --environment=auto, which must not fall back to local's unsandboxed root commands
    (review 6); the twin, the same runner without supplementary groups, is accepted."""
    runs = _without_setgroups(CHECK)
    assert runs[""].stdout == "bwrap bwrap\nauto bwrap\n", runs[""].stderr
    refused = (
        "refused: --environment=bwrap cannot run this root runner's commands as nobody: it holds supplementary "
        "groups (10 20) that its user namespace does not let it drop (/proc/self/setgroups is deny), which its "
        "commands would keep: start it without them"
    )
    assert runs["10,20"].stdout == f"bwrap {refused}\nauto {refused}\n", runs["10,20"].stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="a root runner's check: root, bwrap")
def test_a_root_runner_refuses_a_setuid_bwrap(tmp_path):
    """(review 7) A root runner's commands exec bwrap as nobody after nsenter's drop, without no_new_privs
    and with the whole bounding set (setpriv had set both): a setuid bwrap (some distributions ship one) was
    root again there, its sandbox set up by privileged code. The check refuses it, also for
    --environment=auto; the twin, the same bwrap without the bit first on PATH, is accepted."""
    said = {}
    for mode in (0o4755, 0o755):
        folder = tmp_path / oct(mode)
        folder.mkdir()
        shutil.copy(shutil.which("bwrap"), folder / "bwrap")
        os.chmod(folder / "bwrap", mode)
        path = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
        said[mode] = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=path, timeout=60)
    assert said[0o755].stdout == "bwrap bwrap\nauto bwrap\n", said[0o755]
    refused = (
        "refused: --environment=bwrap cannot run this root runner's commands as nobody: its bwrap "
        f"({tmp_path / oct(0o4755) / 'bwrap'}) is setuid or setgid: install bubblewrap without it (a root runner "
        "needs none)"
    )
    assert said[0o4755].stdout == f"bwrap {refused}\nauto {refused}\n", said[0o4755]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="a root runner's check: root, bwrap")
def test_the_browser_toolset_says_why_a_setuid_bwrap_cannot_sandbox_chromium(run, server, tmp_path, monkeypatch):
    """(review 8) The browser's sandbox asked bwrap's check and caught its SetupError alone: a root runner's
    refusal (a UsageError: here a setuid bwrap) killed the browser service with a traceback, and the run
    said only that the service exited with 1. It says why now, in one line, exit 2, no request sent."""
    folder = tmp_path / "suid"
    folder.mkdir()
    shutil.copy(shutil.which("bwrap"), folder / "bwrap")
    os.chmod(folder / "bwrap", 0o4755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    page = {"prompt": 'open a page [mock call=browser_navigate:{"url": "http://127.0.0.1:1/"}]'}
    done = run([page], "--distribution=browser_use", "--environment=local")
    assert done.code == 2 and "Traceback" not in done.stderr, done.stderr
    why = f"its bwrap ({folder / 'bwrap'}) is setuid or setgid"
    said = (
        "error: the browser toolset: Chromium does not run as root without a sandbox, and bwrap cannot sandbox "
        f"it here: --environment=bwrap cannot run this root runner's commands as nobody: {why}: install bubblewrap "
        "without it (a root runner needs none)\n"
    )
    assert said in done.stderr, done.stderr
    assert not server.chat_requests()


# A worker's own sample, without the driver's check at start (a Ray worker on a node of its own): what it says.
OPEN = (
    "import asyncio; from trajforge import plugins; from trajforge.environments import EnvironmentSettings, "
    "backend_for; from trajforge.environments.limits import Limits; from trajforge.errors import SetupError\n"
    "plugins.load()\n"
    "async def sample():\n"
    "    settings = EnvironmentSettings(kind='bwrap', limits=Limits(max_disk_mb=0))  # no disk in a user namespace\n"
    "    try: env = await backend_for(settings).open({})\n"
    "    except SetupError as exc: return f'refused: {exc}'\n"
    "    try: return (await env.exec('id -G')).output.strip()\n"
    "    finally: await env.close()\n"
    "print(asyncio.run(sample()))"
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="maps the host's uids: root, bwrap")
def test_a_worker_whose_groups_cannot_be_dropped_runs_no_command():
    """(review 6) bwrap's check of the drop to nobody ran on the driver only: a Ray worker on a node whose
    user namespace denies setgroups ran every command with the worker's supplementary groups. Each worker
    asks it once too, and its samples fail instead; the twin, without supplementary groups, runs its
    command as nobody, in the sandbox in its user's group alone (the attack's showed a second, unmapped)."""
    runs = _without_setgroups(OPEN)
    assert runs["10,20"].stdout.startswith("refused: --environment=bwrap cannot run this root worker's"), runs
    assert "supplementary groups (10 20)" in runs["10,20"].stdout, runs["10,20"].stdout
    assert (runs[""].stdout, runs[""].returncode) == ("1000\n", 0), runs[""]  # the sandbox user's group alone
