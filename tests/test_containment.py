"""Tools never block the worker and no process a prompt started outlives it: in-process through the
environment API (local and bwrap), plus one real run where a finished prompt's daemon is checked while
the next prompt still runs, and a hostile dataset refused before any request."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import ROOT, Runner, detach_as_bound, loop_sequence, released, source, tool_results, wait_for
from test_environments import _available, make_settings, sync

from trajforge.environments import EnvironmentSettings, ExecResult, backend_for, disk, liveness, tmpfs
from trajforge.environments.limits import RUNNER, Limits, confined, unenforced
from trajforge.environments.local import (
    ROOT_LOCAL_VERIFIED,
    TERM_GRACE,
    LocalBackend,
    run_process,
    workspace_prefix,
)
from trajforge.environments.trees import below, remove_tree
from trajforge.tools.transfer import read_bytes


@pytest.fixture(params=["local", "bwrap"])
def kind(request) -> str:
    return _available(request)


LOCAL_RUN = ("--environment=local", "--distribution=terminal_only", "--command_timeout=120")


def marker() -> str:
    """A unique `sleep` argument that names this test's processes in /proc."""
    return f"1000.{random.randrange(10**8)}"


def still_running(argument: str, within: float = 2.0) -> list[int]:
    """running_with() once the processes just killed had `within` seconds to die: a SIGKILL (of a PID
    namespace's members when its init dies) is delivered before the kill returns, the exit comes a moment
    later, and a killed process runs no more of its own code meanwhile."""
    deadline = time.monotonic() + within
    while (left := running_with(argument)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def running_with(argument: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds `argument`."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                if argument.encode() in handle.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def zombie_children() -> set[int]:
    me, found = os.getpid(), set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == b"Z" and int(fields[1]) == me:
            found.add(int(name))
    return found


@pytest.mark.parametrize("special", ["fifo", "/dev/urandom", "/dev/zero", "socket"])
def test_file_tools_refuse_what_is_not_a_regular_file_at_once(kind, tmp_path, special):
    async def body():
        env = await backend_for(make_settings(kind, tmp_path, command_timeout=30.0)).open({})
        listener = None
        try:
            path = special
            if special == "fifo":
                path = "pipe"
                await env.exec("mkfifo pipe")
            elif special == "socket":
                path = os.path.join(env.cwd, "listening.sock")
                listener = socket.socket(socket.AF_UNIX)
                listener.bind(path)
                listener.listen()
            started = time.monotonic()
            with pytest.raises(OSError, match="not a regular file"):
                await env.read_file(path)
            with pytest.raises(OSError, match="not a regular file"):
                await env.write_file(path, "x")
            with pytest.raises(FileNotFoundError, match="not a regular file"):
                await read_bytes(env, path, 1000)  # how vision reads an image
            return time.monotonic() - started
        finally:
            if listener:
                listener.close()
            await env.close()

    assert sync(body()) < 5, "a file tool waited on what it should have refused"


def test_a_command_that_closes_its_output_and_ignores_sigterm_is_killed(kind, tmp_path):
    stubborn = marker()

    async def body(env):
        started = time.monotonic()
        result = await env.exec(f"exec >&- 2>&-; trap '' TERM; sleep {stubborn}", timeout=1)
        return result, time.monotonic() - started

    async def in_env():
        env = await backend_for(make_settings(kind, tmp_path)).open({})
        try:
            return await body(env), still_running(stubborn)
        finally:
            await env.close()

    (result, took), left = sync(in_env())
    assert result.timed_out and result.exit_code == 124
    assert took < 1 + TERM_GRACE + 2
    assert not left, "the command outlived its time limit"


@pytest.mark.parametrize(
    "launch",
    [
        "setsid sleep {} > /dev/null 2>&1 &",
        "(sleep {} > /dev/null 2>&1 &);",  # a double fork: its parent is gone before the shell ends
        "nohup sleep {} > /dev/null 2>&1 &",
        "setsid sh -c 'trap \"\" TERM HUP; sleep {}' > /dev/null 2>&1 &",
    ],
    ids=["setsid", "double-fork", "nohup", "setsid-ignoring-term"],
)
def test_no_process_a_prompt_started_outlives_its_environment(kind, tmp_path, launch):
    daemon = marker()

    async def body():
        env = await backend_for(make_settings(kind, tmp_path)).open({})
        try:
            result = await env.exec(launch.format(daemon) + " echo launched")
            assert result.exit_code == 0 and "launched" in result.output, result
            if kind == "local":  # bwrap's PID namespace already ended it with the command
                wait_for(lambda: running_with(daemon), 10, "the daemon to start")
        finally:
            await env.close()

    # This process adopts orphans (orphans.py) once an environment opened here: earlier tests' may wait.
    before = zombie_children()
    sync(body())
    # The kernel ends a PID namespace's processes (bwrap) as it goes, not at once: allow it a moment.
    wait_for(lambda: not running_with(daemon), 5, "the prompt's daemon to be gone")
    # A zombie that is collected by itself (asyncio reaps its own child a moment after it exits) is no leftover.
    wait_for(lambda: zombie_children() <= before, 5, "no zombie left by the prompt's daemon")


def test_a_finished_prompts_daemon_is_gone_while_the_run_goes_on(kind, tmp_path, server):
    daemon = marker()
    command = f"setsid sleep {daemon} > /dev/null 2>&1 & echo daemon-started".replace(" ", "%20")
    entries = [{"prompt": f"start a daemon [mock command={command}]"}, {"prompt": "wait [mock sleep=8]"}]
    runner = Runner(tmp_path, server)
    flags = (f"--environment={kind}", "--distribution=terminal_only", "--num_workers=1")
    argv = runner.command(entries, *flags, batch_size=1)
    env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")}
    batch = tmp_path / "out" / "run" / "batch_0.jsonl"
    with subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        try:
            wait_for(lambda: batch.exists() and batch.read_text().strip(), 60, "the first prompt's line")
            wait_for(lambda: not running_with(daemon), 5, "the first prompt's daemon to go")
            assert run.poll() is None, "the run ended before the check: it proves nothing"
            _, stderr = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
    assert run.returncode == 0, stderr
    first = json.loads(batch.read_text().splitlines()[0])
    assert "daemon-started" in json.dumps(first["turns"])  # the journalled sample: its turns
    assert not running_with(daemon)


def test_a_daemon_that_leaves_its_sample_s_cgroup_is_gone_before_verification(run_here, tmp_path):
    """Root may write any cgroup.procs: a root runner's local command can move its daemon out of the
    sample's cgroup, where the cgroup's kill misses it; the sample's marker, looked for among the
    worker's descendants after that kill, does not. No timing: the model's command returns only once
    the daemon has written where it is, and the verification itself looks for the daemon. The twin's
    daemon stays in its cgroup. The workers fork from a process that is a subreaper itself, which they
    are not by inheritance: each must ask the kernel again (orphans.become_subreaper)."""
    if os.geteuid() != 0 or unenforced(Limits(), "local", RUNNER):
        pytest.skip("needs a root runner that makes sample cgroups: only root can leave one")
    # This process adopts orphans once it opened an environment (earlier tests' do): the workers fork from it.
    backend_for(make_settings("local", tmp_path))
    leaver, stayer = marker(), marker()

    def entry(daemon: str, leave: bool) -> dict:
        move = "for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/*/cgroup.procs; do echo $$ >$f; done; " * leave
        script = f"{move}cat /proc/$$/cgroup >where.tmp && mv where.tmp where; exec sleep {daemon}"
        command = f"setsid sh -c '{script}' >/dev/null 2>&1 & while [ ! -e where ]; do sleep 0.05; done; cat where"
        alive = daemon.replace(".", "\\.")[:-1] + f"[{daemon[-1]}]"  # matches the daemon, not the pattern itself
        return {
            "prompt": f"start a daemon [mock command={quote(command, safe='')}]",
            "verify": f"! grep -qs '{alive}' /proc/[0-9]*/cmdline",
        }

    result = run_here(
        [entry(leaver, True), entry(stayer, False)], "--environment=local", "--distribution=terminal_only"
    )
    assert result.code == 0, result.stderr
    rows = {source(row)["prompt"]: row for row in result.trajectories}
    left, stayed = (
        tool_results(rows[entry(daemon, leave)["prompt"]]) for daemon, leave in ((leaver, True), (stayer, False))
    )
    assert "batch-runner-" in stayed, stayed  # the twin's daemon was in its sample's cgroup
    assert "0::" in left and "batch-runner-" not in left, f"the daemon did not leave its cgroup: {left}"
    for row in rows.values():
        assert row["metadata"]["verification"]["passed"] is True, row["metadata"]["verification"]
    assert not running_with(leaver) and not running_with(stayer)
    assert result.stderr.count(ROOT_LOCAL_VERIFIED) == 1, result.stderr  # a daemon that drops its marker too lives on


def test_a_root_runner_s_verified_local_run_says_where_its_clean_room_ends(run_here):
    """The daemon above also dropping its marker (env -i) would live into the verification: a root runner's
    local run that verifies says so at start; one that verifies nothing does not (the twin)."""
    if os.geteuid() != 0:
        pytest.skip("only a root runner's command can leave its cgroup")
    verified = run_here([{"prompt": "hi", "verify": "true"}], "--environment=local", run_name="verified")
    plain = run_here([{"prompt": "hi"}], "--environment=local", run_name="plain")
    assert verified.code == plain.code == 0, verified.stderr + plain.stderr
    assert verified.stderr.count(ROOT_LOCAL_VERIFIED) == 1 and ROOT_LOCAL_VERIFIED not in plain.stderr


LINGERING_TOOL = '''
import threading
import time


def linger(seconds: float) -> dict:
    """Starts a thread that outlives the call, as a careless tool may.

    Args:
        seconds: how long the thread sleeps
    """
    threading.Thread(target=time.sleep, args=(seconds,), name="lingering").start()
    return {"started": True}
'''


def test_a_worker_that_cannot_exit_after_its_samples_is_killed_and_the_run_ends(run_here, tmp_path):
    """A thread left running (not a daemon) keeps a worker process from exiting: the run waits for it a
    bounded time (pool.WIND_DOWN), kills it, says so, and ends with every output written."""
    tools = tmp_path / "lingering.py"
    tools.write_text(LINGERING_TOOL)
    called = quote(json.dumps({"seconds": 3600}), safe="")
    entries = [{"prompt": f"[mock call=linger:{called}] linger"}]
    result = run_here(entries, f"--tools={tools}", "--environment=local", "--distribution=terminal_only")
    assert result.code == 0, result.stderr
    assert "had not exited 5 s after its samples ended and was killed" in result.stderr, result.stderr
    assert '"started": true' in tool_results(result.trajectories[0])
    assert (result.run_dir / "report.html").exists() and result.statistics["completed"] == 1


def test_a_hostile_dataset_is_refused_before_any_request(run_here, server):
    deep = '{"prompt": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines = [
        {"prompt": "fine"},
        deep,
        {"prompt": "nested", "extra": json.loads("[" * 300 + "]" * 300)},
        '{"prompt": "surrogate \\ud800"}',
        '{"prompt": "big", "n": ' + str(2**70) + "}",
        {"prompt": "escape", "cwd": "../../.."},
    ]
    result = run_here(lines, "--environment=local")
    assert result.code == 2, result.stderr
    assert "Traceback" not in result.stderr
    for number in (2, 3, 4, 5, 6):
        assert f"line {number}:" in result.stderr
    assert "line 1:" not in result.stderr
    assert not server.chat_requests()
    assert not (result.run_dir / "trajectories.jsonl").exists()


def test_closing_is_quick_when_nothing_was_left(kind, tmp_path):
    async def body():
        env = await backend_for(make_settings(kind, tmp_path)).open({})
        await env.exec("true")
        started = time.monotonic()
        await env.close()
        return time.monotonic() - started

    assert sync(body()) < 2


@pytest.mark.parametrize("keep", [False, True], ids=["removed", "kept"])
@pytest.mark.parametrize("disk_mb", [0, 64], ids=["no disk", "disk"])
def test_what_a_root_command_left_mounted_in_its_folders_is_let_go_of_not_emptied(tmp_path, disk_mb, keep):
    """A root runner's local commands run in the host's mount namespace: a chroot the model set up in its
    workspace (`mount --bind` of a host folder) and left mounted is unmounted when the sample closes, never
    emptied with the workspace (shutil.rmtree goes into a mount: the host's folder was emptied). Also at paths
    /proc/self/mounts escapes (a space, a newline) and one of other bytes (UTF-8); the plain folder beside them
    goes as ever, and so does the workspace. A workspace kept (--keep_workspaces) keeps its files, not the
    host's folder bound among them (review 19: a later `rm -rf` of it emptied that)."""
    if not tmpfs.possible():
        pytest.skip("only the host's root mounts")
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("the host's")
    chroot = " ".join(map(shlex.quote, ["jail/dev", "jail/with space", "jail/new\nline", "jail/dév"]))
    binds = f'for d in {chroot}; do mkdir -p "$d" && mount --bind {host} "$d"; done'

    async def body() -> tuple:
        settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=disk_mb), keep_workspaces=keep)
        env = await backend_for(settings).open({})
        made = await env.exec(f"mkdir plain && echo mine > plain/file; {binds}; ls jail/dév")
        workspace = env.workspace
        await env.close()
        return made, workspace

    made, workspace = sync(body())
    assert made.output.split() == ["precious"], made  # mounted, as a chroot's are
    assert (host / "precious").read_text() == "the host's"
    assert not tmpfs.mounted_below(workspace)
    if keep:
        assert Path(workspace, "plain", "file").read_text() == "mine\n" and not os.listdir(f"{workspace}/jail/dev")
        shutil.rmtree(workspace)
    else:
        assert not os.path.exists(workspace)


# Where a command mounts a host folder: a chroot's plain folder, names /proc/self/mounts does not escape though
# bytes.split cut them there (so the point read was another, unmounted "already"), and the workspace itself.
MOUNTED_AT = {
    "a chroot's folder": "jail/dev",
    "a carriage return": "jail/a\rb",
    "a vertical tab": "jail/a\vb",
    "a form feed": "jail/a\fb",
    "the workspace itself": ".",
}


@pytest.mark.parametrize("where", MOUNTED_AT)
def test_a_root_command_s_mount_is_let_go_of_whatever_its_point_is_named(tmp_path, where):
    """Review 19: a mount point named with a carriage return, vertical tab or form feed (written as they are
    in /proc/self/mounts) was read cut short, and a host folder bound on the workspace itself (not below it)
    was never looked for: the sample's close emptied the host's folder. Each is let go of as the chroot's is."""
    if not tmpfs.possible():
        pytest.skip("only the host's root mounts")
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("the host's")
    point = shlex.quote(MOUNTED_AT[where])

    async def body() -> tuple:
        env = await backend_for(make_settings("local", tmp_path, limits=Limits(max_disk_mb=0))).open({})
        made = await env.exec(f'mkdir -p {point} && mount --bind {shlex.quote(str(host))} {point} && ls "$PWD"/{point}')
        workspace = env.workspace
        await env.close()
        return made, workspace

    made, workspace = sync(body())
    assert made.output.split() == ["precious"], made
    assert (host / "precious").read_text() == "the host's"
    assert not os.path.exists(workspace) and not tmpfs.mounted_below(workspace)


# Where a root command leaves a host folder ({host}) mounted so that the sample's disk, going (its workspace's
# bind and its root unmounted lazily), does not take it along (review 32); nothing, the honest twin.
AROUND_THE_DISK = {
    "nothing": "true",
    "below the workspace's path, the disk bound over it again": (
        "cd / && umount -l {workspace} && mkdir {workspace}/q && mount --bind {host} {workspace}/q && "
        "mount --bind {disk_workspace} {workspace}"
    ),
    "on the workspace's path, more times than are unmounted": (
        "for i in $(seq 65); do mount --bind {host} {workspace} || exit 1; done"
    ),
    "in the clean room's /tmp, under more mounts on the disk's root": (
        "mkdir -p {decoy}/$(basename {verify})/q && mount --bind {decoy} {root} && mount --bind {host} {verify}/q && "
        "for i in $(seq 64); do mount --bind {decoy} {root} || exit 1; done"
    ),
    "in the workspace's folder on the disk": "mkdir {disk_workspace}/q && mount --bind {host} {disk_workspace}/q",
    "in the disk's folder": "mkdir {folder}/q && mount --bind {host} {folder}/q",
    "on the disk's tests folder": "mount --bind {host} {folder}/tests",
    "over the disk's folder": "mount --bind {host} {folder}",
}


def _host_and(tmp_path: Path, other: str) -> tuple[Path, Path]:
    """A folder standing for the host's (one file in it) and an empty one named `other` beside it."""
    host, beside = tmp_path / "host", tmp_path / other
    host.mkdir()
    beside.mkdir()
    (host / "precious").write_text("the host's")
    return host, beside


def _host_and_decoy(tmp_path: Path) -> tuple[Path, Path]:
    """_host_and with an empty folder to mount over others; skipped where the runner cannot make a disk."""
    if not disk.possible():
        pytest.skip("only the host's root makes a disk")
    return _host_and(tmp_path, "decoy")


@pytest.mark.parametrize("keep", [False, True], ids=["", "kept"])
@pytest.mark.parametrize("where", AROUND_THE_DISK)
def test_what_a_root_command_mounted_around_the_sample_s_disk_is_not_emptied(tmp_path, where, keep):
    """Review 32: a sample with a disk reads no mount table at its end for its folders on the disk, whose lazy
    unmounting takes what lies mounted below them along; but what a root command mounted where that unmounting
    does not reach was emptied by the folders' removal (rmtree goes into a mount): below the workspace's host
    path with the disk bound over it again, on that path more times than unmount lets go of, in the clean
    room's /tmp under more mounts on the disk's root, in the disk's folder, on its tests folder or over it
    whole. The host's folder keeps its files, whatever stays mounted is left for the run's end; the honest
    twin's workspace and disk go, nothing of them left mounted. Review 33: with --keep_workspaces too, where the
    clean room's /tmp was still walked after the disk's unmounting let go of the mounts stacked on its root and
    found the host's folder bound in it; the honest twin's workspace kept, its files copied there, unmounted. And
    a host folder bound in the workspace's folder through the disk's root was copied into the kept workspace with
    the sample's files: left out now (copy_files takes what lies on the disk alone)."""
    host, decoy = _host_and_decoy(tmp_path)

    async def body() -> tuple:
        settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=64), keep_workspaces=keep)
        env = await backend_for(settings).open({})
        assert env.disk is not None
        assert (await env.exec("echo mine > kept")).exit_code == 0
        await env.clean_variables()
        paths = {"host": host, "decoy": decoy, "workspace": env.workspace, "disk_workspace": env.disk_workspace}
        paths |= {"verify": env.disk_verify, "root": env.disk.root, "folder": env.disk.folder}
        quoted = {name: shlex.quote(str(path)) for name, path in paths.items()}
        made = await env.exec(AROUND_THE_DISK[where].format(**quoted))
        await env.close()
        return made, env.workspace, paths["folder"]

    made, workspace, folder = sync(body())
    try:
        assert made.exit_code == 0, made
        assert (host / "precious").read_text() == "the host's"
        if where in ("nothing", "in the workspace's folder on the disk"):
            assert os.path.exists(workspace) == keep and not os.path.exists(folder)
            assert not tmpfs.mounted_below(workspace) and not tmpfs.mounted_below(folder)
            assert not keep or (Path(workspace) / "kept").read_text() == "mine\n"
            assert not keep or "precious" not in {entry.name for entry in below(workspace)}  # the host's not copied
        left_out = f"--keep_workspaces: 1 entries of the workspace kept in {workspace} left out: not copied"
        notes = disk.take_notes()  # none left for another test of this process to read
        assert where != "in the workspace's folder on the disk" or notes == ([left_out] if keep else [])
    finally:
        _let_go_of(workspace, folder)
    assert (host / "precious").read_text() == "the host's"


def _let_go_of(*paths: str) -> None:
    """What a command stacked on or below `paths` unmounted, as the run's end does (remove_leftovers), then the
    paths removed."""
    for _ in range(200):
        points = [point for path in paths for point, _ in tmpfs.mounted_below(path)]
        if not points:
            break
        for point in sorted(set(points), key=len):
            tmpfs.unmount(point)
    for path in paths:
        remove_tree(path)


# What a root command leaves over its disk's folder ({decoy} bound there), with a host folder ({host}) bound on
# the disk below it or not; nothing, the honest twin.
UNDER_A_COVER = {
    "nothing": "true",
    "nothing below": "mount --bind {decoy} {folder}",
    "a host folder on the disk": "mkdir {root}/q && mount --bind {host} {root}/q && mount --bind {decoy} {folder}",
}


@pytest.mark.parametrize("below", UNDER_A_COVER)
def test_the_run_s_end_lets_go_of_what_lies_under_a_mount_over_a_disk_s_folder(tmp_path, below):
    """Review 33: a root command's mount over its disk's folder keeps the disk mounted past the sample's end
    (its root's path goes through that mount, the folder is not the one made: left for the run's end). There
    remove_leftovers unmounted each listed point by its path once: the disk and a host folder bound on it read
    as unmounted through the cover, were there again once it went, and the folder's removal emptied the host's
    folder. Now in rounds, the mount table read again: the host's folder keeps its files, nothing of the run
    stays mounted, its disk's folder goes; the honest twin's is gone at the sample's end already."""
    host, decoy = _host_and_decoy(tmp_path)
    settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=64))

    async def body() -> tuple:
        env = await backend_for(settings).open({})
        assert env.disk is not None
        paths = {"host": host, "decoy": decoy, "root": env.disk.root, "folder": env.disk.folder}
        made = await env.exec(UNDER_A_COVER[below].format(**{k: shlex.quote(str(v)) for k, v in paths.items()}))
        await env.close()
        return made, paths["folder"]

    made, folder = sync(body())
    try:
        assert made.exit_code == 0, made
        assert (host / "precious").read_text() == "the host's"
        assert bool(tmpfs.mounted_below(folder)) == (below != "nothing")
        LocalBackend.remove_leftovers(settings)
        assert (host / "precious").read_text() == "the host's"
        assert not tmpfs.mounted_below(folder) and not os.path.exists(folder)
    finally:
        _let_go_of(folder)
    assert (host / "precious").read_text() == "the host's"


# What a root command puts in the folder ({decoy}) it then binds over its workspace more times than the sample's end
# and the run's end's first round let go of (64 each), a host folder bound in the workspace below them: a link named
# as the folder that bind lies in, to a host folder ({target}) with a mount of the host's there; nothing, the honest
# twin (the same binds and covers).
IN_THE_COVER = {"a link": "ln -s {target} {decoy}/jail && ", "nothing": ""}


@pytest.mark.parametrize("cover", IN_THE_COVER)
def test_the_run_s_end_unmounts_no_host_mount_through_a_link_in_a_cover(tmp_path, cover):
    """The run's end unmounts the points the mount table lists below the run's folders by their paths, a round's
    all at once: a point below a cover still there (more covers than one unmount lets go of) was reached through
    the cover, and through a link the command put in it to a host folder, which unmounted the host's own mount
    there (a link to /: its /sys, its /proc). A listed point is unmounted only through a path without a link now:
    the host's mount stays, and the run's go in the rounds after, nothing of them left mounted, its folder gone.
    The honest twin's go likewise."""
    host, decoy = _host_and(tmp_path, "decoy")
    (tmp_path / "target" / "x").mkdir(parents=True)
    if not tmpfs.mount(str(tmp_path / "target" / "x"), 1, None):
        pytest.skip("only the host's root mounts")
    settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=0))
    binds = "mkdir -p jail/x && mount --bind {host} jail/x && cd / && for i in $(seq 130); do "
    binds += "mount --bind {decoy} {workspace} || exit 1; done"

    async def body() -> tuple:
        env = await backend_for(settings).open({})
        paths = {"host": host, "decoy": decoy, "target": tmp_path / "target", "workspace": env.workspace}
        quoted = {name: shlex.quote(str(path)) for name, path in paths.items()}
        made = await env.exec((IN_THE_COVER[cover] + binds).format(**quoted))
        await env.close()
        return made, env.workspace

    made, workspace = sync(body())
    try:
        assert made.exit_code == 0, made
        LocalBackend.remove_leftovers(settings)
        assert os.path.ismount(tmp_path / "target" / "x")
        assert not tmpfs.mounted_below(workspace) and not os.path.exists(workspace)
    finally:
        _let_go_of(workspace)
        tmpfs.unmount(str(tmp_path / "target" / "x"))
    assert (host / "precious").read_text() == "the host's"


# Loop devices a sample's root command left bound, each printed ({image}: its disk's image): of a file on its disk
# (which holds the disk with it), of its disk's image, of a file on another such device's file system, of a file in
# a workspace with no disk, mounted through one on a folder of the host's ({outside}: it holds the device, and the
# disk); mounted in its workspace through one (mount -o loop: it goes with its mount) and none, the honest twins.
# Each: (--max_disk_mb, the command).
MADE_LOOPS = {
    "none": (64, "true"),
    "of a file on its disk": (64, "truncate -s 8M f && losetup -f --show f"),
    "of its disk's image": (64, "losetup -f --show {image}"),
    "of a file on another's file system": (
        64,
        "truncate -s 16M f && mkfs.ext4 -q f && d=$(losetup -f --show f) && echo $d && mkdir m && mount $d m && "
        "truncate -s 8M m/g && losetup -f --show m/g",
    ),
    "of a file with no disk": (0, "truncate -s 8M f && losetup -f --show f"),
    "mounted on a folder of the host's": (
        64,
        "truncate -s 16M f && mkfs.ext4 -q f && mount -o loop f {outside} && findmnt -n -o SOURCE {outside}",
    ),
    "mounted in its workspace": (
        64,
        "truncate -s 16M f && mkfs.ext4 -q f && mkdir m && mount -o loop f m && findmnt -n -o SOURCE m",
    ),
}


@pytest.mark.parametrize("made", MADE_LOOPS)
def test_the_run_s_end_lets_go_of_the_loop_devices_a_root_command_left(tmp_path, made):
    """A root local command's loop device without autoclear (`losetup -f`) stayed bound past its sample and the
    run, for the host's life: bound to a file on the sample's disk, it also kept the disk (its file system, its
    loop device and its image's blocks, the image gone from the temporary folder). The run's end lets go of every
    loop device bound to a file of the run (in its folders, or on such a device however deep), and the sample's
    disk goes with them; of no other device: another run's sample in flight keeps its disk and the loop device
    its command made, and the host's own stays. The honest twins leave none bound."""
    if not disk.possible():
        pytest.skip("only the host's root makes loop devices")
    size, command = MADE_LOOPS[made]
    settings = make_settings("local", tmp_path / "run", limits=Limits(max_disk_mb=size))
    another = make_settings("local", tmp_path / "another", limits=Limits(max_disk_mb=64))
    (tmp_path / "host").write_bytes(bytes(1 << 20))
    outside = tmp_path / "outside"
    outside.mkdir()

    async def sample(settings: EnvironmentSettings, command: str) -> tuple:
        env = await backend_for(settings).open({})
        image = os.path.join(env.disk.folder, "image") if env.disk else ""
        done = await env.exec(command.format(image=shlex.quote(image), outside=shlex.quote(str(outside))))
        devices = done.output.split() + ([_loop_device(os.stat(env.disk.root).st_dev)] if env.disk else [])
        return env, done, {device: loop_sequence(device) for device in devices}

    async def body() -> tuple:
        env, done, bound = await sample(settings, command)
        await env.close()
        in_flight, _, kept = await sample(another, MADE_LOOPS["of a file on its disk"][1])
        return done, bound, in_flight, kept

    done, bound, in_flight, kept = sync(body())
    try:
        hosts = subprocess.run(["losetup", "-f", "--show", str(tmp_path / "host")], capture_output=True, text=True)
        kept[hosts.stdout.strip()] = loop_sequence(hosts.stdout.strip())  # the host's own
        assert done.exit_code == 0 and all(bound.values()) and all(kept.values()), (done, bound, kept)
        LocalBackend.remove_leftovers(settings)
        wait_for(lambda: not _still_bound(bound), 5, lambda: f"{_still_bound(bound)} let go of")
        assert sorted(_still_bound(kept)) == sorted(kept) and not os.path.ismount(outside)
    finally:
        sync(in_flight.close())
        tmpfs.unmount(str(outside))
        detach_as_bound(bound | kept)
        LocalBackend.remove_leftovers(settings)
        LocalBackend.remove_leftovers(another)


# Prints the loop device the command leaves bound to a file on its disk, and the disk's, each with its sequence number.
# The disk by its number: the mount table names it by the descriptor it was mounted through (/proc/self/fd/N).
LEFT_BOUND = (
    "truncate -s 8M f && d=$(losetup -f --show f) && "
    "s=/dev/$(basename $(readlink /sys/dev/block/$(stat -c %Hd:%Ld .))) && "
    'for x in $d $s; do echo "$x $(cat /sys/block/${x#/dev/}/diskseq)"; done'
)


def test_a_whole_run_lets_go_of_the_loop_device_its_sample_left_and_of_its_disk(run_here):
    """The same through a run of batch_runner.py: once it has ended, the loop device its sample's command left
    bound to a file on the sample's disk is bound no more, and neither is the disk it held."""
    if not disk.possible():
        pytest.skip("only the host's root makes loop devices")
    result = run_here([{"prompt": f"loop [mock command={quote(LEFT_BOUND, safe='')}]"}], *LOCAL_RUN, "--max_disk_mb=64")
    bound = dict(re.findall(r"(/dev/loop\d+) (\d+)", tool_results(result.trajectories[0])))
    try:
        assert result.code == 0 and len(bound) == 2, (result.stderr, bound)
        wait_for(lambda: not _still_bound(bound), 5, lambda: f"{_still_bound(bound)} let go of")
    finally:
        detach_as_bound(bound)


# What a root command puts at the node of the loop device it leaves bound to a file of its workspace ({host}: a
# loop device of the host's, bound to a file of the host's): a FIFO (opening it blocked the run's end for good);
# the host device's node, and its own at the host device's (the host's was detached, as the file its own node's
# name is bound to in sysfs lies in the run's folders); nothing, the honest twin. Each prints the device it left.
AT_THE_NODE = {
    "nothing": "",
    "a FIFO": " && rm $d && mkfifo -m 600 $d",
    "the host device's node, swapped": (
        " && rm $d {host} && mknod -m 600 $d b 7 {number} && mknod -m 600 {host} b 7 ${{d#/dev/loop}}"
    ),
}


# The sample and the run's end of test_the_run_s_end_opens_no_node_in_dev_but_the_loop_device_it_names, in a mount
# namespace and a /dev of their own: the command's nodes are put in that /dev alone (put in the host's, other tests'
# loop devices were opened, bound and detached through them meanwhile, and failed at random). Prints the command's
# result, then whether the run's end ended. No disk: the command's file lies in the run's folders by its path (on a
# disk unmounted it is named from the disk's root, and the run's end found the device through its file's device,
# the node's swap unseen: the host's was kept without the node check too).
NODE_RUN = """
import asyncio, json, sys, threading
from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.environments.limits import Limits
from trajforge.environments.local import LocalBackend
plugins.load()
settings = EnvironmentSettings(
    kind="local", command_timeout=10.0, run_name="contract", run_dir=sys.argv[1], limits=Limits(max_disk_mb=0)
)
async def sample():
    env = await backend_for(settings).open({})
    done = await env.exec(sys.argv[2])
    await env.close()
    return done
done = asyncio.run(sample())
print(json.dumps([done.exit_code, done.output]), flush=True)
ending = threading.Thread(target=LocalBackend.remove_leftovers, args=(settings,), daemon=True)
ending.start()
ending.join(30)
print(json.dumps(not ending.is_alive()), flush=True)
"""
# A /dev of its own ($1, a folder): the host's few nodes a run uses, the loop control and 256 loop devices' nodes.
OWN_DEV = (
    'mount -t tmpfs -o mode=755 none "$1" && cp -a /dev/null /dev/zero /dev/full /dev/urandom /dev/random "$1"/ && '
    'mknod -m 600 "$1/loop-control" c 10 237 && n=0 && while [ $n -lt 256 ]; do '
    'mknod -m 600 "$1/loop$n" b 7 $n || exit; n=$((n + 1)); done && ln -s /proc/self/fd "$1/fd" && '
    'mount --move "$1" /dev && shift && exec "$@"'
)


@pytest.mark.parametrize("node", AT_THE_NODE)
def test_the_run_s_end_opens_no_node_in_dev_but_the_loop_device_it_names(tmp_path, node):
    """The run's end opens each bound loop device through its node in /dev, which a root local command can replace:
    with a FIFO the run's end never ended (its open waits for a writer), with another device's node it read that
    device as the one the node is named after (another loop device's: the host's detached and its mounts unmounted,
    in the place of the command's; a char device's opened, a watchdog armed). A node that is not the loop device of
    its name is left as it is (the command's own device then stays bound: it made that so). The twin's device goes.
    The sample and the run's end run in a mount namespace and a /dev of their own (NODE_RUN)."""
    if not disk.possible() or not shutil.which("unshare"):
        pytest.skip("only the host's root makes loop devices")
    with contextlib.suppress(OSError), open("/sys/module/loop/parameters/max_part") as parts:
        if parts.read().strip() not in ("", "0"):
            pytest.skip("loop devices with partitions: a device's minor is not its number")
    settings = make_settings("local", tmp_path / "run")
    (tmp_path / "host").write_bytes(bytes(1 << 20))
    host = subprocess.run(["losetup", "-f", "--show", str(tmp_path / "host")], capture_output=True, text=True)
    host = host.stdout.strip()
    kept = {host: loop_sequence(host)}
    command = "truncate -s 8M f && d=$(losetup -f --show f) && echo $d" + AT_THE_NODE[node]
    command = command.format(host=host, number=host.removeprefix("/dev/loop"))
    (tmp_path / "dev").mkdir()
    own = ["unshare", "-m", "--propagation", "private", "sh", "-c", OWN_DEV, "sh", str(tmp_path / "dev")]
    argv = [*own, sys.executable, "-c", NODE_RUN, settings.run_dir, command]
    ran = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    bound: dict[str, str] = {}
    try:
        exit_code, output = json.loads(ran.stdout.readline() or "[null, null]")
        bound = {device: loop_sequence(device) for device in (output or "").split()}
        assert exit_code == 0 and len(bound) == 1 and all(bound.values()) and kept[host], (exit_code, output, bound)
        assert json.loads(ran.stdout.readline() or "false"), "the run's end opened the FIFO"
        assert _still_bound(kept) == [host]
        assert _still_bound(bound) == ([] if node == "nothing" else list(bound))
    finally:
        ran.kill()
        ran.wait()
        detach_as_bound(bound | kept)
        LocalBackend.remove_leftovers(settings)


@pytest.mark.parametrize("swapped", [False, True], ids=["its folder", "a link put in its place meanwhile"])
def test_a_listed_point_is_unmounted_through_the_folder_looked_at(tmp_path, monkeypatch, swapped):
    """unmount_listed looks at a point's folder, then unmounts: a process still running at the run's end (a root
    command that left its cgroup) that put a link to a host folder in the folder's place between the two had the
    host's own mount at the link's target unmounted. The folder is held from the look to the unmounting, which goes
    through it (the run's mount, moved aside with its folder, goes); its twin's point is unmounted as ever."""
    if not tmpfs.possible():
        pytest.skip("only the host's root mounts")
    folder, host = tmp_path / "workspace", tmp_path / "host"
    for path in (folder / "x", host / "x"):
        path.mkdir(parents=True)
        assert tmpfs.mount(str(path), 1, None)
    unmount = tmpfs.unmount

    def racing(path: str) -> bool:
        if swapped and not folder.is_symlink():
            folder.rename(tmp_path / "aside")
            folder.symlink_to(host)
        return unmount(path)

    monkeypatch.setattr(tmpfs, "unmount", racing)
    try:
        assert tmpfs.unmount_listed(str(folder / "x"))
        assert os.path.ismount(host / "x") and not os.path.ismount(
            tmp_path / "aside" / "x" if swapped else folder / "x"
        )
    finally:
        for path in (host / "x", tmp_path / "aside" / "x", folder / "x"):
            unmount(str(path))


def _loop_device(number: int) -> str:
    """The path of the loop device numbered `number` (a file system's st_dev)."""
    return "/dev/" + os.path.basename(os.readlink(f"/sys/dev/block/{os.major(number)}:{os.minor(number)}"))


def _still_bound(bound: dict[str, str]) -> list[str]:
    """The loop devices of `bound` still bound as they were then (another test may have bound one since)."""
    return [device for device, file in bound.items() if loop_sequence(device) == file]


# What a root command puts in a folder ({decoy}) it binds over the temporary folder, a host folder bound in its
# workspace below it: a link named as its workspace or as its disk's folder, to a host folder ({target}) with mounts
# of the host's below it where the workspace's bind and the disk lie in theirs (jail/x, fs); nothing, the twins.
# Each: (--max_disk_mb, what the folder holds).
OVER_THE_TEMPORARY_FOLDER = {
    "nothing": (0, ""),
    "nothing, a disk": (64, ""),
    "a link named as the workspace": (0, "ln -s {target} {decoy}/$(basename {workspace}) && "),
    "a link named as the disk's folder": (64, "ln -s {target} {decoy}/$(basename {folder}) && "),
}


@pytest.mark.parametrize("holding", OVER_THE_TEMPORARY_FOLDER)
def test_a_mount_over_the_temporary_folder_has_no_host_mount_unmounted_nor_folder_emptied(
    tmp_path, monkeypatch, holding
):
    """A root command's mount over the temporary folder (a folder of the host's bound there, not one of the sample's
    folders) answers for its workspace's path and what lies below it, hidden: the host folder bound in the
    workspace (and the sample's disk) stays mounted there, unreached, past the sample and the run (no path of theirs
    reaches it any more; the run's next start does once the mount over the temporary folder is gone), and no folder
    of the host's is emptied (their removal goes through the same mount). With a link named as the workspace in
    the folder mounted there, to a host folder, the sample's end unmounted the host's own mount below that folder
    (the path of the bind it listed led there), and with one named as the disk's folder, the one where the disk
    lies in its folder: never now, through no path with a link. The host's mounts and folder stay."""
    host, decoy = _host_and(tmp_path, "decoy")
    temporary, target = tmp_path / "temporary", tmp_path / "target"
    temporary.mkdir()
    mounted = [target / "jail" / "x", target / "fs"]
    for point in mounted:
        point.mkdir(parents=True)
        if not tmpfs.mount(str(point), 1, None):
            pytest.skip("only the host's root mounts")
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    size, linked = OVER_THE_TEMPORARY_FOLDER[holding]
    settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=size))
    command = "mkdir -p jail/x && mount --bind {host} jail/x && " + linked + "mount --bind {decoy} {temporary}"

    async def body() -> tuple:
        env = await backend_for(settings).open({})
        paths = {"host": host, "decoy": decoy, "target": target, "temporary": temporary, "workspace": env.workspace}
        paths["folder"] = env.disk.folder if env.disk else ""
        made = await env.exec(command.format(**{name: shlex.quote(str(path)) for name, path in paths.items()}))
        await env.close()
        return made, env.workspace

    made, workspace = sync(body())
    try:
        assert made.exit_code == 0, made
        assert all(map(os.path.ismount, mounted))
        LocalBackend.remove_leftovers(settings)
        assert all(map(os.path.ismount, mounted)) and tmpfs.mounted_below(workspace)
    finally:
        tmpfs.unmount(str(temporary))
        LocalBackend.remove_leftovers(settings)
        for point in mounted:
            tmpfs.unmount(str(point))
    assert (host / "precious").read_text() == "the host's"


@pytest.mark.parametrize("through", ["the folder", "a symlink"])
def test_a_root_command_s_mount_is_let_go_of_where_tmpdir_is_a_symlink(tmp_path, monkeypatch, through):
    """Review 19: /proc/self/mounts names a mount point through no symlink; with a TMPDIR that is one (a
    cluster's /scratch) no workspace's path matched it, so a chroot's bind was emptied with the workspace at
    the sample's close, and a killed attempt's at the run's end (remove_leftovers). Both let go of now."""
    if not tmpfs.possible():
        pytest.skip("only the host's root mounts")
    host, temporary = _host_and(tmp_path, "temporary")
    if through == "a symlink":
        (tmp_path / "link").symlink_to(temporary)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("link" if through == "a symlink" else "temporary")))
    settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=0))
    left = temporary / (workspace_prefix(settings) + "killed")
    (left / "jail").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host), str(left / "jail")], check=True)

    async def body() -> str:
        env = await backend_for(settings).open({})
        made = await env.exec(f"mkdir jail && mount --bind {shlex.quote(str(host))} jail && ls jail")
        assert made.output.split() == ["precious"], made
        await env.close()
        return env.workspace

    workspace = sync(body())
    assert (host / "precious").read_text() == "the host's" and not os.path.exists(workspace)
    LocalBackend.remove_leftovers(settings)
    assert (host / "precious").read_text() == "the host's"
    assert not left.exists() and not tmpfs.mounted_below(str(left))


# What a killed sample's root command left around its workspace on its disk, for the run's end to keep
# (--keep_workspaces): a host folder ({host}) bound in it (a chroot's), over it, over it more times than are
# unmounted at once, or over the disk's folder with a folder of the disk bound in that; nothing, the honest twin.
KEPT_AROUND = {
    "nothing": "true",
    "in the workspace": "mkdir jail && mount --bind {host} jail",
    "over the workspace": "mount --bind {host} {workspace}",
    "over the workspace, more times than are unmounted": (
        "for i in $(seq 65); do mount --bind {host} {workspace} || exit 1; done"
    ),
    "over the disk's folder, a mount in it": (
        "mkdir {folder}/q {root}/q && mount --bind {root}/q {folder}/q && mount --bind {host} {folder}"
    ),
}


@pytest.mark.parametrize("where", KEPT_AROUND)
def test_a_killed_run_s_kept_workspace_holds_its_files_and_no_host_folder_s(tmp_path, where):
    """The run's end with --keep_workspaces copies a killed sample's workspace off its disk (keep_workspaces_below)
    before the disks go: it copied whatever the workspace's path reached, a host folder bound in it (a chroot's
    /etc: its files copied out, up to the disk's size) or over it; moved the copy into whatever stayed on top of
    that path (the host's file replaced by its copy); took a mount below the disk's folder for a workspace and
    made its copy's folder where a host folder over the disk's folder put it, whose missing entry then raised out
    of the run's end: nothing of the run was unmounted. Now only a workspace of the temporary folder lying on a
    disk of the run is copied, no host folder mounted among its files, and nothing is moved onto what is still
    mounted: the host's folder is untouched, nothing of the run stays mounted, the disk's folder goes. The honest
    twin's kept workspace holds its files, as does the chroot's (without the host's)."""
    host, _ = _host_and_decoy(tmp_path)
    precious = (host / "precious").stat().st_ino
    settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=64), keep_workspaces=True)

    async def body() -> tuple:
        env = await backend_for(settings).open({})  # never closed, as when its worker is killed
        assert env.disk is not None
        paths = {"host": host, "workspace": env.workspace, "root": env.disk.root, "folder": env.disk.folder}
        quoted = {name: shlex.quote(str(path)) for name, path in paths.items()}
        made = await env.exec("echo mine > kept && " + KEPT_AROUND[where].format(**quoted))
        return made, env.workspace, env.disk.folder

    made, workspace, folder = sync(body())
    try:
        assert made.exit_code == 0, made
        LocalBackend.remove_leftovers(settings)
        assert os.listdir(host) == ["precious"] and (host / "precious").stat().st_ino == precious
        assert not tmpfs.mounted_below(workspace) and not tmpfs.mounted_below(folder) and not os.path.exists(folder)
        assert "precious" not in {entry.name for entry in below(workspace)}
        assert where not in ("nothing", "in the workspace") or (Path(workspace) / "kept").read_text() == "mine\n"
        left_out = f"--keep_workspaces: 1 entries of the workspace kept in {workspace} left out: not copied"
        assert disk.take_notes() == ([left_out] if where == "in the workspace" else [])  # the chroot's bind said
    finally:
        _let_go_of(workspace, folder)
    assert (host / "precious").read_text() == "the host's"


@pytest.mark.parametrize("disk_mb", [0, 64], ids=["no disk", "disk, kept"])
@pytest.mark.parametrize("swapped", [False, True], ids=["its folder", "a symlink in its place"])
def test_the_sample_s_end_unmounts_nothing_where_a_symlink_in_its_workspace_s_place_points(tmp_path, swapped, disk_mb):
    """A root command can move its workspace aside and put a symlink to a host folder in its place: the sample's
    end took the workspace through that symlink and unmounted whatever lay mounted below where it pointed, the
    host's own mounts (a symlink to /: every mount of the host). Only what lies on or below the workspace's own
    path is let go of now: the host's mount stays, and what the command moved aside goes at the run's end (with
    a disk and --keep_workspaces, where its close also raised, copying into the symlink). The twin leaves its
    workspace in place, and the host's mount stays too."""
    if not tmpfs.possible():
        pytest.skip("only the host's root mounts")
    host, mounted = _host_and(tmp_path, "mounted")
    assert tmpfs.mount(str(mounted), 1, None)  # a mount of the host's, below the folder the symlink names
    settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=disk_mb), keep_workspaces=bool(disk_mb))
    swap = "cd / && {{ umount {w} 2>/dev/null; mv {w} {w}.aside && ln -s {target} {w}; }}"

    async def body() -> tuple:
        env = await backend_for(settings).open({})
        quoted = {"w": shlex.quote(env.workspace), "target": shlex.quote(str(tmp_path))}
        made = await env.exec(swap.format(**quoted) if swapped else "true")
        await env.close()
        return made, env.workspace

    made, workspace = sync(body())
    try:
        assert made.exit_code == 0, made
        assert os.path.ismount(mounted)
        LocalBackend.remove_leftovers(settings)
        assert os.path.ismount(mounted)
        kept = bool(disk_mb)  # the workspace (or the symlink in its place) and what was moved aside
        assert os.path.lexists(workspace) == kept and os.path.lexists(workspace + ".aside") == (kept and swapped)
        refused = f"--keep_workspaces: the workspace could not be kept in {workspace}: Not a directory"
        assert disk.take_notes() == ([refused] if kept and swapped else [])  # said, not raised; none left for others
    finally:
        _let_go_of(workspace, workspace + ".aside")
        tmpfs.unmount(str(mounted))
    assert (host / "precious").read_text() == "the host's"


@pytest.mark.parametrize("temporary", ["missing", "there"])
def test_a_sample_whose_workspace_could_not_be_made_fails_with_its_own_error(tmp_path, monkeypatch, temporary):
    """(review 23) A local sample whose start failed before its workspace was made (a full or missing
    temporary folder) is closed with no folder of its own: the unmounting of what its commands left found the
    common start of no folders (ValueError, not an OSError), which replaced the start's own error. The twin's
    workspace is made, used and gone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / temporary))
    if temporary == "there":
        (tmp_path / temporary).mkdir()
    settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=0))

    async def body() -> str:
        env = await backend_for(settings).open({}, "named")
        try:
            assert (await env.exec("pwd")).output.strip() == env.workspace
            return env.workspace
        finally:
            await env.close()

    if temporary == "missing":
        with pytest.raises(FileNotFoundError):
            sync(body())
    else:
        assert not os.path.exists(sync(body()))


def test_the_mount_table_is_read_for_each_folder_not_for_their_common_start(tmp_path):
    """(review 23) A sample's folders lie side by side in the temporary folder: the lines of the mount table
    holding their common start were every sample's. Each folder's mounts are found, and none of a folder
    beside them (another sample's, the twin's: found when it is asked for)."""
    if not tmpfs.possible():
        pytest.skip("only the host's root mounts")
    folders = [tmp_path / name for name in ("workspace", "tests", "another sample's")]
    for folder in folders:
        (folder / "jail").mkdir(parents=True)
        assert tmpfs.mount(str(folder / "jail"), 1, None)
    try:
        found = {point for point, _ in tmpfs.mounts(str(folders[0]), str(folders[1]))}
        assert found == {str(folders[0] / "jail"), str(folders[1] / "jail")}
        assert [point for point, _ in tmpfs.mounts(str(folders[2]))] == [str(folders[2] / "jail")]
        assert tmpfs.mounts() == []
    finally:
        tmpfs.detach_below([str(folder) for folder in folders])
    assert not tmpfs.mounted_below(str(tmp_path))


def test_a_killed_attempt_s_mount_in_its_workspace_is_let_go_of_when_the_sample_runs_again(tmp_path):
    """The workspace of a sample run again has its name: what a killed attempt's root command left mounted
    in it is unmounted before the folder is emptied for the new attempt, the host's folder kept."""
    if not tmpfs.possible():
        pytest.skip("only the host's root mounts")
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("the host's")
    settings = make_settings("local", tmp_path, limits=Limits(max_disk_mb=0))
    left = Path(tempfile.gettempdir(), workspace_prefix(settings) + "again")
    (left / "jail").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host), str(left / "jail")], check=True)

    async def body() -> tuple:
        env = await backend_for(settings).open({}, "again")
        try:
            return env.workspace, (await env.exec("ls -A")).output
        finally:
            await env.close()

    workspace, listed = sync(body())
    assert workspace == str(left) and listed.split() == [".tmp"]  # the same name, emptied
    assert (host / "precious").read_text() == "the host's" and not tmpfs.mounted_below(str(left))


def test_what_a_killed_run_left_goes_when_another_run_starts_and_a_live_run_s_stays(run, tmp_path, monkeypatch):
    """A run killed by SIGKILL and never resumed (a nightly run named by its date) left its workspaces, disks
    and the processes in its cgroups until the host went down. Now the next run started on the machine removes
    them, whatever its folder (liveness.py): no process of the killed run holds its marker any more. A run
    that is still going (its command waits for the test) holds its own: a third run's start touches nothing
    of it, and it ends with its workspace's file intact. A marker another user planted, or a link, is left
    alone; a run that ended leaves no marker. The runs' TMPDIR is the test's own: no other test's run sweeps."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # for the runs, which are processes of their own
    killed_sleep, gate = marker(), tmp_path / "gate"
    leave = f"echo mine > f; exec sleep {killed_sleep}"
    killed = subprocess.Popen(
        run.command([{"prompt": f"stay [mock command={quote(leave, safe='')}]"}], *LOCAL_RUN),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    killed_prefix = _prefix(tmp, tmp_path / "out" / "run")
    wait_for(lambda: running_with(killed_sleep), what="the killed run's command")
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    wait_for(lambda: released(run), what="the killed run's workers to be gone")
    assert glob.glob(killed_prefix + "*") and running_with(killed_sleep)  # what it left
    wait_here = f"echo kept > f; while [ ! -e {gate} ]; do sleep 0.05; done; cat f"
    live = _runner(tmp_path, "live", run).start(
        [{"prompt": f"wait [mock command={quote(wait_here, safe='')}]"}], *LOCAL_RUN
    )
    live_prefix = _prefix(tmp, tmp_path / "live" / "out" / "run")
    try:
        wait_for(lambda: glob.glob(live_prefix + "*"), what="the live run's workspace")
        left_by_kill = glob.glob(killed_prefix + "*") or running_with(killed_sleep)  # the live run's start swept
        planted, victim = _planted(tmp, tmp_path)
        other = _runner(tmp_path, "other", run)([{"prompt": "hi"}], *LOCAL_RUN)
        live_left = glob.glob(live_prefix + "*")
        left_alone = [path for path in (*planted, victim) if os.path.lexists(path)]
        gate.touch()
        ended = live.result()
    finally:
        gate.touch()
        live.kill()
    assert not left_by_kill and not still_running(killed_sleep)
    assert other.code == 0 and ended.code == 0, other.stderr + ended.stderr
    assert live_left and "kept" in tool_results(ended.trajectories[0])
    assert left_alone == [*planted, victim]
    assert sorted(tmp.glob("*" + liveness.SUFFIX)) == sorted(planted)  # the runs' own: swept, or gone at their end


def _runner(tmp_path: Path, name: str, run: Runner) -> Runner:
    """Another run folder's runner, its dataset in a folder of its own."""
    (tmp_path / name).mkdir()
    return Runner(tmp_path / name, run.server)


def _planted(tmp: Path, tmp_path: Path) -> tuple[tuple[Path, Path], Path]:
    """Two markers no run made, and a folder one names, in `tmp`: a link, and nobody's file naming a folder whose
    tag it has, with a workspace of that folder's (nobody's marker would have it removed)."""
    tag = EnvironmentSettings(run_dir=str(tmp_path / "victim")).run_tag
    link = tmp / f"{liveness.PREFIX}{'0' * 12}{liveness.SUFFIX}"
    link.symlink_to(tmp_path / "nowhere")
    nobodys = tmp / f"{liveness.PREFIX}{tag}{liveness.SUFFIX}"
    nobodys.write_text(json.dumps({"run_dir": str(tmp_path / "victim")}))
    os.chown(nobodys, 65534, 65534)
    victim = tmp / f"{liveness.PREFIX}{tag}-planted"
    victim.mkdir()
    return (link, nobodys), victim


def _prefix(tmp: Path, run_dir: Path) -> str:
    """Where the temporary folders of the run in `run_dir` lie in `tmp`, and what their names start with."""
    return str(tmp / workspace_prefix(EnvironmentSettings(run_dir=str(run_dir.resolve()))))


def test_the_event_loop_stays_free_while_a_big_workspace_is_removed(tmp_path):
    async def body():
        env = await backend_for(make_settings("local", tmp_path)).open({})
        await env.exec("mkdir many && cd many && seq 1 20000 | xargs touch")
        gaps, closing = [], asyncio.create_task(env.close())
        while not closing.done():
            before = time.monotonic()
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - before)
        await closing
        return max(gaps)

    assert sync(body()) < 0.5


def test_without_a_cgroup_a_daemon_is_found_among_the_workers_descendants(tmp_path):
    # No limit asks for a cgroup: the prompt's marker, looked for below this process only, ends it.
    daemon = marker()
    settings = make_settings("local", tmp_path, limits=Limits(max_processes=0, max_memory_mb=0))

    async def body():
        env = await backend_for(settings).open({})
        try:
            await env.exec(f"setsid sh -c 'trap \"\" TERM; sleep {daemon}' > /dev/null 2>&1 & echo launched")
            wait_for(lambda: running_with(daemon), 10, "the daemon to start")
            assert not env.cgroup.paths
        finally:
            await env.close()

    sync(body())
    wait_for(lambda: not running_with(daemon), 5, "the prompt's daemon to be gone")


def test_without_a_cgroup_a_prompt_s_end_ends_its_own_processes_and_no_other_prompt_s(tmp_path):
    """A prompt's end walks this worker's descendants but what runs of other prompts' commands (a prompt's
    processes descend from its own commands, or from the worker once their parent ended): its own daemon and
    what its still running server started go; another prompt's command running meanwhile, its child
    included, runs on to its own end and says so."""
    daemon, served, other = marker(), marker(), f"3.{random.randrange(10**8)}"
    settings = make_settings("local", tmp_path, limits=Limits(max_processes=0, max_memory_mb=0))

    async def body():
        backend = backend_for(settings)
        first, second = await backend.open({}), await backend.open({})
        try:
            await first.exec(f"setsid sh -c 'trap \"\" TERM; sleep {daemon}' > /dev/null 2>&1 & echo launched")
            server = await first.spawn(["sh", "-c", f"setsid sleep {served} & read line"], {})
            running = asyncio.create_task(second.exec(f"sleep {other} & wait; echo done"))
            await asyncio.to_thread(wait_for, lambda: all(map(running_with, (daemon, served, other))), 10, "them")
            await first.close()
            await server.end()
            assert not still_running(daemon, 5) and not still_running(served, 5)
            assert running_with(other)
            assert await running == ExecResult("done\n", 0)
        finally:
            await second.close()

    sync(body())


# Forks until its child has the number argv[1] (ns_last_pid: root), which runs `sleep argv[2]` in a session of its own
# and, once this script exits, is a child of the worker (its subreaper).
TAKE_NUMBER = """
import os, sys
target, mark = int(sys.argv[1]), sys.argv[2]
for _ in range(500):
    with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
        handle.write(str(target - 1))
    pid = os.fork()
    if pid == 0:
        if os.getpid() == target:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execvp("sleep", ["sleep", mark])
        os._exit(0)
    if pid == target:
        print("took it")
        break
    os.waitpid(pid, 0)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="choosing a process's number (ns_last_pid) takes root")
def test_without_a_cgroup_a_daemon_on_the_number_of_another_prompt_s_ended_server_is_ended(tmp_path):
    """Another prompt's server exited by itself (asyncio collected it) and its end is not asked for yet: its number
    is free, and this prompt's daemon that took it, re-parented to the worker, is still this prompt's, ended before
    its verification. It was left out as that prompt's running command, with everything below it (review 34)."""
    daemon = marker()
    settings = make_settings("local", tmp_path, limits=Limits(max_processes=0, max_memory_mb=0))

    async def body():
        backend = backend_for(settings)
        first, second = await backend.open({}), await backend.open({})
        servers = []
        try:
            for _ in range(5):  # a process of another test may take the freed number first: then a new server's
                servers.append(server := await second.spawn(["sh", "-c", "exit 0"], {}))
                await server.process.wait()
                number = server.process.pid
                took = await first.exec(f"{sys.executable} -c {shlex.quote(TAKE_NUMBER)} {number} {daemon}")
                if took.output:
                    break
            assert took == ExecResult("took it\n", 0)
            assert running_with(daemon) == [number]
            await first.end_agent_processes()
            assert not still_running(daemon, 5)
        finally:
            await first.close()
            for server in servers:
                await server.end()
            await second.close()

    try:
        sync(body())
    finally:
        for pid in running_with(daemon):
            os.kill(pid, signal.SIGKILL)


def test_without_a_cgroup_another_prompt_s_running_server_outlives_a_prompt_s_end(tmp_path):
    """The honest twin: another prompt's server that still runs, and what it started, are left to their own end
    (its `end`) by this prompt's, which ends this prompt's daemon."""
    daemon, served = marker(), marker()
    settings = make_settings("local", tmp_path, limits=Limits(max_processes=0, max_memory_mb=0))

    async def body():
        backend = backend_for(settings)
        first, second = await backend.open({}), await backend.open({})
        server = await second.spawn(["sh", "-c", f"sleep {served} & read line"], {})
        try:
            await first.exec(f"setsid sleep {daemon} > /dev/null 2>&1 &")
            await asyncio.to_thread(wait_for, lambda: running_with(daemon) and running_with(served), 10, "both")
            await first.end_agent_processes()
            assert not still_running(daemon, 5)
            assert running_with(served) and server.process.returncode is None
        finally:
            await first.close()
            await server.end()
            await second.close()
        assert not still_running(served, 5)

    sync(body())


# Each generation starts its successor (a new process, or itself again by exec) and is gone a moment later.
MOVING_ON = 'sleep 0.05; setsid sh -c "$WALK" sh "$1" & exit 0'
RE_EXEC = 'sleep 0.05; exec sh -c "$AGAIN" sh "$1"'


def test_without_a_cgroup_daemons_that_move_on_or_re_exec_themselves_are_gone(tmp_path):
    """One scan of the worker's descendants can miss a process amid exec, or one that re-parented to the
    worker after the worker's children were listed: a scan ends the prompt only when it is sure of both.
    A daemon that forks its successor and exits, and one that execs itself, over and over, are gone."""
    walker, again = marker(), marker()
    settings = make_settings("local", tmp_path, limits=Limits(max_processes=0, max_memory_mb=0))

    async def body():
        env = await backend_for(settings).open({})
        try:
            launch = f'(setsid sh -c "$WALK" sh {walker} &); (setsid sh -c "$AGAIN" sh {again} &); echo launched'
            await env.exec(f"export WALK='{MOVING_ON}' AGAIN='{RE_EXEC}'; {launch}")
            for daemon in (walker, again):  # one of each is there at any time (its successor before it goes)
                wait_for(lambda daemon=daemon: running_with(daemon), 10, "the daemons to start")
            assert not env.cgroup.paths
        finally:
            await env.close()

    try:
        sync(body())
        assert not still_running(walker, 5) and not still_running(again, 5)
    finally:
        for pid in running_with(walker) + running_with(again):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)


def test_a_command_runs_in_its_own_shell_behind_its_limits_with_its_line_numbers():
    limits = Limits(max_file_size_mb=2)
    argv = confined(["sh", "-c", "nosuch-command", "sh", "x"], limits, ["/sys/fs/cgroup/pids/a b"])
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", "x"]
    assert "'/sys/fs/cgroup/pids/a b'/cgroup.procs" in argv[2] and "ulimit -f 4096" in argv[2]
    assert "\n" not in argv[2]  # the command's errors name the lines the model wrote
    done = subprocess.run(confined(["sh", "-c", "nosuch-command; ulimit -f"], limits, []), capture_output=True)
    assert b"1: nosuch-command: not found" in done.stderr and done.stdout == b"4096\n"
    wrapped = confined(["tar", "-xf", "-"], limits, [])  # not a shell: one runs it, with `exec`
    assert wrapped[2].endswith('exec "$@"') and wrapped[3:] == ["sh", "tar", "-xf", "-"]
    assert confined(["true"], Limits(0, 0, 0), []) == ["true"]


COMMAND_ENV = {"PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize("own_output", [False, True], ids=["agent", "verification"])
@pytest.mark.parametrize("leftover", [True, False], ids=["left holding stdin", "reads it all"])
def test_a_command_s_result_does_not_wait_on_a_leftover_that_holds_its_stdin_unread(own_output, leftover):
    """(review 31) A command's stdin was fed until every reader was gone: one whose shell exited, a background
    process of it holding its stdin (and not its output) unread, said nothing until its time limit, then 124,
    also in the clean room (whose result is what its first process wrote). As asyncio did, the feed ends with
    the command's first process. The honest twin: a command that reads its stdin gets all of it."""
    stays = marker()
    command = f"exec 3<&0; sleep {stays} <&3 >/dev/null 2>&1 & echo done" if leftover else "wc -c"
    try:
        started = time.monotonic()
        done = sync(run_process(["sh", "-c", command], "/", COMMAND_ENV, 5, b"x" * 1_000_000, own_output=own_output))
        took = time.monotonic() - started
    finally:  # the leftover, once its shell's child has become it (it may still be a shell when the result comes)
        deadline = time.monotonic() + 5 * leftover
        while not running_with(stays) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in running_with(stays):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert not done.timed_out and done.exit_code == 0, done
    assert done.output == ("done\n" if leftover else "1000000\n") and took < 3, (done, took)


TRACER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
print(libc.ptrace(0x4206, int(sys.argv[1]), 0, 0), flush=True)  # PTRACE_SEIZE, and never a wait for it
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.parametrize("traced", [True, False])
def test_a_command_that_exited_under_another_process_s_trace_keeps_the_event_loop_idle(tmp_path, traced):
    """(review 31) A command's first process that exited while another process traced it is a zombie its tracer
    takes the report of first: its pidfd was readable from its exit and the worker not yet allowed to collect it,
    so the event loop looked at it at every turn, its CPU all used till the tracer let go (2 s here). The honest
    twin: untraced, it is collected at its exit."""
    number = tmp_path / "pid"

    async def body():
        command = asyncio.ensure_future(
            run_process(["sh", "-c", f"echo $$ > {number}; exec sleep 0.5"], "/", COMMAND_ENV, 20)
        )
        while not number.exists() or not number.read_text().strip():
            await asyncio.sleep(0.01)
        tracer = None
        if traced:
            tracer = subprocess.Popen([sys.executable, "-c", TRACER, number.read_text(), "2.5"], stdout=subprocess.PIPE)
            assert tracer.stdout is not None and tracer.stdout.readline() == b"0\n", "no ptrace here"
        before, started = resource.getrusage(resource.RUSAGE_THREAD), time.monotonic()
        done = await command
        after = resource.getrusage(resource.RUSAGE_THREAD)
        if tracer is not None:
            tracer.wait()
        return done, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, time.monotonic() - started

    done, cpu, took = sync(body())
    assert done.exit_code == 0 and not done.timed_out, done
    assert took > 1.5 if traced else took < 1.5, took
    assert cpu < 0.2, f"the event loop's thread used {cpu:.2f} s of CPU waiting {took:.2f} s for a command"


def test_a_command_whose_stdin_pipe_could_not_be_made_leaves_no_descriptor_open():
    """(review 31) The output pipe was made, then the stdin pipe outside the cleanup: out of descriptors (EMFILE)
    between the two, the output pipe's two stayed open for the worker's life, one more pair each time. The honest
    twin: with room, the command runs and leaves none."""

    def open_descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def body():
        fine = await run_process(["cat"], "/", COMMAND_ENV, 5, b"fed")
        assert fine.output == "fed" and fine.exit_code == 0, fine
        before = open_descriptors()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        filler: list[int] = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, before + 4096), hard))
        try:
            with contextlib.suppress(OSError):
                while True:
                    filler.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
            for _ in range(3):  # room for the output pipe, not for the stdin's
                os.close(filler.pop())
            for _ in range(3):
                with pytest.raises(OSError, match="Too many open files"):
                    await run_process(["cat"], "/", COMMAND_ENV, 5, b"fed")
        finally:
            for fd in filler:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        again = await run_process(["cat"], "/", COMMAND_ENV, 5, b"fed")
        return before, open_descriptors(), again

    before, after, again = sync(body())
    assert again.output == "fed" and again.exit_code == 0, again
    assert after == before, f"{after - before} descriptors left open"
