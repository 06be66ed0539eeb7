"""What a command sees: bwrap shows only the system's directories and the workspace (no home, no run
folder, no host socket), every backend gives a clean set of variables, and --environment=auto chooses
bwrap where it works, else local with one warning. Real bwrap runs, through the environment API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import API_KEY, tool_results

from trajforge.environments import AUTO, EnvironmentSettings, ExecResult, backend_for, choose
from trajforge.environments.bwrap import BwrapBackend
from trajforge.environments.bwrap_session import CONTROL
from trajforge.environments.local import SYSTEM_PATH
from trajforge.environments.orphans import state
from trajforge.errors import SetupError

HIDDEN = ("/home", "/root", "/run", "/var/run", "/mnt", "/media", "/srv", "/var")
SHOWN = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt", "dev", "proc", "tmp"}
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


@pytest.fixture
def bwrap():
    try:
        BwrapBackend.check(EnvironmentSettings(kind="bwrap"))
    except SetupError as exc:
        pytest.skip(f"bwrap cannot run on this machine: {exc}")


def settings(kind: str, tmp_path: Path, **changes) -> EnvironmentSettings:
    return EnvironmentSettings(kind=kind, command_timeout=20.0, run_name="sandbox", run_dir=str(tmp_path), **changes)


async def _in_env(settings: EnvironmentSettings, commands: list[str], entry: dict | None = None):
    env = await backend_for(settings).open(entry or {})
    try:
        return [await env.exec(command) for command in commands]
    finally:
        await env.close()


def run_commands(settings: EnvironmentSettings, *commands: str, entry: dict | None = None):
    return asyncio.run(_in_env(settings, list(commands), entry))


@pytest.fixture
def host_folder():
    """A folder of the host outside any workspace, holding a file a command must not read."""
    folder = tempfile.mkdtemp(prefix="sandbox-host-")
    Path(folder, "answers.txt").write_text("reference answer")
    yield folder
    shutil.rmtree(folder)


# -- what bwrap shows -----------------------------------------------------------------------------
def test_bwrap_hides_home_run_and_every_host_folder(bwrap, tmp_path, host_folder):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "trajectories.jsonl").write_text("other prompts")
    listings = run_commands(
        settings("bwrap", run_dir),
        *(f"ls {path}" for path in HIDDEN),
        f"ls {run_dir}",
        f"cat {run_dir}/trajectories.jsonl",
        f"cat {host_folder}/answers.txt",
        "ls /",
    )
    *hidden, root = listings
    for path, result in zip([*HIDDEN, run_dir, run_dir, host_folder], hidden, strict=True):
        assert result.exit_code != 0 and "No such file" in result.output, (path, result)
    assert set(root.output.split()) <= SHOWN


def test_bwrap_keeps_system_symlinks_and_reads_system_folders(bwrap, tmp_path):
    links, etc = run_commands(settings("bwrap", tmp_path), "readlink /bin /lib; true", "cat /etc/passwd | head -1")
    expected = [os.readlink(path) for path in ("/bin", "/lib") if os.path.islink(path)]
    assert links.output.split() == expected
    assert etc.exit_code == 0 and etc.output.startswith("root:")


def test_bwrap_has_private_tmp_shm_proc_and_a_minimal_dev(bwrap, tmp_path):
    marker = tempfile.mkstemp(prefix="host-tmp-file-")[1]  # in the host's /tmp
    try:
        tmp, shm, proc, dev = run_commands(
            settings("bwrap", tmp_path),
            "echo kept > /tmp/a && cat /tmp/a && ls /tmp",
            "echo x > /dev/shm/b && cat /dev/shm/b",
            "ls /proc | grep -c '^[0-9]'",
            "ls /dev",
        )
    finally:
        os.remove(marker)
    assert tmp.output.startswith("kept\n") and os.path.basename(marker) not in tmp.output
    assert shm.output == "x\n"
    assert int(proc.output) < 10  # only the command's own processes
    assert {"null", "zero", "urandom", "shm"} <= set(dev.output.split()) and "sda" not in dev.output


@pytest.fixture
def host_socket(tmp_path):
    """A Unix socket server in a host folder (/run when this user may write there, else the test's
    folder); yields its path and a function telling whether anyone connected."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-sock-", dir="/run" if os.access("/run", os.W_OK) else tmp_path))
    path = folder / "host.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    server.setblocking(False)

    def connected() -> bool:
        try:
            server.accept()[0].close()
        except BlockingIOError:
            return False
        return True

    yield path, connected
    server.close()
    shutil.rmtree(folder)


def test_bwrap_cannot_reach_a_host_unix_socket(bwrap, tmp_path, host_socket):
    path, connected = host_socket
    connect = "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])"
    seen, attempt, docker = run_commands(
        settings("bwrap", tmp_path),
        f"test -e {path}",
        f"python3 -c '{connect}' {path}",
        " || ".join(f"test -e {sock}" for sock in DOCKER_SOCKETS),
    )
    assert seen.exit_code == 1 and docker.exit_code == 1
    assert attempt.exit_code != 0 and "FileNotFoundError" in attempt.output
    assert not connected()


def test_ordinary_work_in_the_workspace_goes_on(bwrap, tmp_path):
    written, python, pip = run_commands(
        settings("bwrap", tmp_path),
        "mkdir -p src && echo 'print(6 * 7)' > src/main.py && cat src/main.py",
        "python3 src/main.py && python3 -c 'import sys; print(sys.executable)'",
        "python3 -m pip --help",
    )
    assert written.output == "print(6 * 7)\n"
    assert python.output == "42\n/usr/bin/python3\n"  # the system's python3: the runner's may live in a home
    assert pip.exit_code == 0 and "Usage:" in pip.output


@pytest.mark.parametrize("cwd", ["../../..", "/etc", "/"])
def test_a_bwrap_cwd_stays_inside_the_workspace(bwrap, tmp_path, cwd):
    with pytest.raises(SetupError, match="outside the prompt's workspace"):
        run_commands(settings("bwrap", tmp_path), "pwd", entry={"cwd": cwd})


def test_a_local_relative_cwd_cannot_leave_the_workspace(tmp_path):
    with pytest.raises(SetupError, match="outside the prompt's workspace"):
        run_commands(settings("local", tmp_path), "pwd", entry={"cwd": "a/../../b"})


# -- the variables a command sees -----------------------------------------------------------------
@pytest.fixture
def runner_variables(monkeypatch, tmp_path):
    """The variables of a runner started from a virtualenv, with a key and a PYTHONPATH."""
    venv_bin = tmp_path / "venv" / "bin"
    monkeypatch.setenv("PATH", f"{venv_bin}:{os.environ['PATH']}")
    monkeypatch.setenv("VIRTUAL_ENV", str(venv_bin.parent))
    monkeypatch.setenv("PYTHONPATH", "/runner/lib")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-leak-5678")


def variables(output: str) -> dict:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


@pytest.mark.parametrize("kind", ["local", "bwrap"])
def test_commands_see_a_clean_environment(kind, request, runner_variables, tmp_path):
    if kind == "bwrap":
        request.getfixturevalue("bwrap")
    env, pwd, made = run_commands(settings(kind, tmp_path), "env", "pwd", "mktemp")
    seen = variables(env.output)
    workspace = pwd.output.strip()
    assert seen["PATH"] == SYSTEM_PATH == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert not {"VIRTUAL_ENV", "PYTHONPATH", "OPENROUTER_API_KEY"} & set(seen) and "leak" not in env.output
    assert seen["HOME"] == workspace
    tmpdir = f"{workspace}/.tmp" if kind == "local" else "/tmp"  # local: the prompt's files go with its workspace
    assert seen["TMPDIR"] == tmpdir and made.output.startswith(tmpdir + "/")


# -- --environment=auto ---------------------------------------------------------------------------
def test_auto_chooses_bwrap_where_it_works(bwrap, tmp_path):
    chosen, warning = choose(settings(AUTO, tmp_path))
    assert chosen.kind == "bwrap" and warning is None


def test_auto_falls_back_to_local_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here
    chosen, warning = choose(settings(AUTO, tmp_path))
    assert chosen.kind == "local" and chosen.run_dir == str(tmp_path)
    assert "no sandbox" in warning and "own rights" in warning and "apt-get install bubblewrap" in warning


def test_a_chosen_kind_stays_as_it_is(tmp_path):
    for kind in ("local", "bwrap", "docker"):
        assert choose(settings(kind, tmp_path)) == (settings(kind, tmp_path), None)


def test_a_default_run_is_sandboxed_and_says_so(bwrap, run):
    # The snooping command reads its parent's command line: the sample's sandbox's spawner's (it sources each
    # command from CONTROL), not the runner's with the key.
    entries = [{"prompt": "one [mock snoop]"}, {"prompt": "two", "cwd": "project"}]
    result = run(entries, "--distribution=terminal_only")
    assert result.code == 0, result.stderr
    assert result.statistics["environment"] == "bwrap"
    assert "--environment=bwrap" in result.stdout and "no sandbox" not in result.stderr
    outputs = {t["prompt_index"]: tool_results(t) for t in result.trajectories}
    assert f"{CONTROL}/" in outputs[0] and "batch_runner.py" not in outputs[0] and API_KEY not in outputs[0]
    assert "mock-model-was-here" in outputs[1] and "/project" in outputs[1]


def test_a_default_run_without_bwrap_warns_once_and_runs_locally(run_here, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # the runner finds no bwrap; commands get the system's PATH
    result = run_here([{"prompt": "one"}, {"prompt": "two"}, {"prompt": "three"}], "--distribution=terminal_only")
    assert result.code == 0, result.stderr
    assert result.statistics["environment"] == "local"
    assert result.stderr.count("no sandbox") == 1 and "--environment=local" in result.stdout
    assert all("mock-model-was-here" in str(t["conversations"]) for t in result.trajectories)


def fake(marker: Path, real: str) -> str:
    """A program that says it ran (in `marker`), then runs the real one at `real`."""
    return f'#!/bin/sh\necho "$0 in $PWD" >> {marker}\nexec {real} "$@"\n'


def test_a_program_in_a_relative_folder_of_path_is_never_run(bwrap, run, server, monkeypatch, tmp_path):
    """(review 10) bwrap was found with shutil.which("bwrap") or "bwrap" (nsenter, which a root runner's
    commands exec before bwrap, as root, likewise; unshare and mkfs.ext4, which the worker runs, too): with
    PATH starting with `.`, a `./bwrap` in the folder the runner started in was found as the relative path
    `./bwrap`, which the check ran there and each command exec'ed again in its own cwd, the sample's
    workspace, where the agent may write one (here it does): that one ran outside the sandbox. Programs are
    searched in PATH's absolute folders alone now, and run by their absolute real paths: no fake runs, and
    the run is sandboxed as its twin. With no absolute folder of PATH holding bwrap, --environment=bwrap is
    refused in one line, exit 2."""
    marker = tmp_path / "fake-ran"
    plant = []
    for name in ("bwrap", "nsenter", "unshare", "mkfs.ext4", "sh", "rm"):  # all but two in the runner's folder alone
        script = fake(marker, os.path.realpath(shutil.which(name, path=f"{os.environ['PATH']}:/usr/sbin:/sbin") or ""))
        (tmp_path / name).write_text(script)
        (tmp_path / name).chmod(0o755)
        plant.append(f"printf '%s' {shlex.quote(script)} > {name} && chmod 755 {name}")
    plant.append("echo planted")
    plant.append("for i in $(seq 1100); do mkdir d && cd d || exit; done")  # rmtree gives up: `rm -rf` removes it
    entries = [{"prompt": f"plant [mock command={quote(' && '.join(plant), safe='')}]"}, {"prompt": "twin"}]
    monkeypatch.setenv("PATH", f".::{os.environ['PATH']}")
    result = run(entries, "--distribution=terminal_only", "--environment=bwrap")
    assert result.code == 0, result.stdout + result.stderr
    assert result.statistics["environment"] == "bwrap" and len(result.trajectories) == 2
    assert "planted" in str([tool_results(row) for row in result.trajectories])
    assert not marker.exists(), marker.read_text()

    # (review 13) Relative folders alone: an empty PATH left would mean the cwd again; the system's default instead.
    monkeypatch.setenv("PATH", ".")
    result = run(entries, "--distribution=terminal_only", "--environment=bwrap", run_name="relative_only")
    assert result.code == 0 and result.statistics["environment"] == "bwrap", result.stdout + result.stderr
    assert not marker.exists(), marker.read_text()

    empty = tmp_path / "no-programs"
    empty.mkdir()
    monkeypatch.setenv("PATH", f".:{empty}")  # the fakes, and an absolute folder without bwrap
    sent = len(server.chat_requests())
    result = run(entries, "--distribution=terminal_only", "--environment=bwrap", run_name="refused")
    assert result.code == 2 and "bubblewrap, which is in no absolute folder of PATH" in result.stderr, result.stderr
    assert len(server.chat_requests()) == sent and not marker.exists()


# -- One sandbox per sample (bwrap_session.py) -------------------------------------------------------------------

SERVE_ONCE = (
    "import socket; s = socket.socket(); s.bind(('127.0.0.1', 8765)); s.listen(); "
    "c, _ = s.accept(); c.sendall(b'served'); c.close()"
)
ASK = "import socket; print(socket.create_connection(('127.0.0.1', 8765), timeout=5).recv(10).decode())"


def test_what_an_agent_command_leaves_running_serves_its_next_one_until_a_timeout_ends_the_sandbox(bwrap, tmp_path):
    """A sample's agent commands run in one sandbox: a server a command leaves running answers the next, as in
    docker. A command that times out ends the sandbox and all it holds; the next starts in a new one."""
    commands = [
        f'python3 -c "{SERVE_ONCE}" > /dev/null 2>&1 & sleep 0.5; echo started',
        f'python3 -c "{ASK}"',
        "sleep 60 & echo $! > /tmp/pid; sleep 30",  # past the time limit (below)
        "kill -0 $(cat /tmp/pid) 2>/dev/null && echo alive || echo gone",
    ]
    started, asked, slow, after = run_commands(replace(settings("bwrap", tmp_path), command_timeout=3.0), *commands)
    assert (started.output, asked.output, asked.exit_code) == ("started\n", "served\n", 0), (started, asked)
    assert slow.timed_out and after.output == "gone\n", (slow, after)


def test_an_agent_that_ends_or_rewrites_its_sandbox_s_spawner_loses_its_own_command_alone(bwrap, tmp_path):
    """The spawner is the agent's uid: a command may end it (its own result then says the sandbox ended) and
    may write on its pipes, never in the runner's control folder (read-only), where each command's text lies:
    the next command runs what the runner gave, in a new sandbox, and the verification, in sandboxes of its
    own, sees no process of the agent's."""
    plant = f"echo 'echo planted' > {CONTROL}/3.sh; echo 'echo planted' > {CONTROL}/9.sh"
    commands = [plant, "kill -9 $PPID; sleep 1; echo never", "echo honest; pwd"]
    env_settings = settings("bwrap", tmp_path)

    async def body():
        env = await backend_for(env_settings).open({})
        try:
            done = [await env.exec(command) for command in commands]
            await env.exec("sleep 302.5 > /dev/null 2>&1 &")  # no other test's: they run side by side
            running = _running("sleep 302.5")
            await env.enter_clean_room()
            return done, env.workspace, running, _running("sleep 302.5")
        finally:
            await env.close()

    (planted, ended, honest), workspace, before, after = asyncio.run(body())
    assert "Read-only file system" in planted.output and planted.exit_code != 0, planted
    assert ended.exit_code == -1 and "sandbox ended" in ended.error and "never" not in ended.output, ended
    assert honest.output == f"honest\n{workspace}\n" and honest.exit_code == 0, honest
    assert (before, after) == (1, 0), (before, after)  # the honest twin: it ran until the agent's end


def _running(command: str) -> int:
    """Processes of the host whose command line is `command`."""
    found = 0
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            found += path.read_bytes().replace(b"\0", b" ").strip() == command.encode()
    return found


# Past the time limit; the spawner ended by the agent after its command.
@pytest.mark.parametrize("ending", ["sleep 30", "(sleep 0.3; kill -9 $PPID) > /dev/null 2>&1 &"])
def test_a_sandbox_that_ended_signals_no_group_that_took_its_number_since(bwrap, tmp_path, ending):
    """(review 28) A sandbox a timeout ended was ended again by the next command and by close(): SIGTERM, then
    SIGKILL, to its bwrap's process group by number, free since bwrap was collected. Whatever group took the
    number meanwhile (another sample's command, a host process: the runner is root) was killed, its children
    collected by the runner. So was one that took the number of a bwrap that ended with its spawner. A group
    leader made with that number (ns_last_pid) lives on; the honest twin: the next command runs, in a new sandbox."""

    async def body():
        env = await backend_for(replace(settings("bwrap", tmp_path), command_timeout=2.0)).open({})
        leader = None
        try:
            await env.exec("true")
            number = env.session.spawned.process.pid
            ended = await env.exec(ending)
            await asyncio.sleep(1)  # the spawner the agent killed is gone and collected
            leader = _group_leader_at(number)
            after = await env.exec("echo next")
            await env.close()
            return ended, after, leader
        except BaseException:
            await env.close()
            raise
        finally:
            _let_go(leader)

    ended, after, leader = asyncio.run(body())
    if leader is None:
        pytest.skip("no process could be made with a given number here (the host's root sets ns_last_pid)")
    assert ended.timed_out or ended.exit_code == 0, ended
    assert after.output == "next\n" and after.exit_code == 0, after
    assert leader.returncode is None, leader.returncode


@pytest.mark.parametrize("kind", ["bwrap", "local"])
def test_a_spawned_server_that_ended_by_itself_signals_no_group_that_took_its_number_since(kind, request, tmp_path):
    """(review 29) A stdio server's end (local._end_spawned: its connection's close) sent SIGTERM, then SIGKILL, to
    its process group by number, and waited for and collected that group's processes, also when the server had
    ended by itself long before (a crash, or its stdin's end) and asyncio had collected it: its number, free since,
    may lead another process's group (another sample's command, a host process: the runner is root), which was
    killed and collected by the runner (another sample's command then said exit 255). A group leader made with
    that number (ns_last_pid) lives on. The honest twin: a server still running is ended, its sandbox with it."""
    if kind == "bwrap":
        request.getfixturevalue("bwrap")

    async def body():
        env = await backend_for(settings(kind, tmp_path)).open({})
        leader = None
        try:
            ended = await env.spawn(["sh", "-c", "echo ready"], {})
            number = ended.process.pid
            await ended.process.wait()  # the server ended by itself; asyncio collected it
            leader = _group_leader_at(number)
            await ended.end()
            running = await env.spawn(["sh", "-c", "echo ready; exec sleep 3.25"], {})
            assert running.process.stdout is not None
            await running.process.stdout.readline()
            await asyncio.wait_for(running.end(), 10)
            return leader, running.process.returncode, _running("sleep 3.25")
        finally:
            await env.close()
            _let_go(leader)

    leader, code, left = asyncio.run(body())
    assert code is not None and left == 0, (code, left)
    if leader is None:
        pytest.skip("no process could be made with a given number here (the host's root sets ns_last_pid)")
    assert leader.returncode is None, leader.returncode


def test_a_timed_out_command_whose_shell_exited_signals_no_group_that_took_its_number_since(tmp_path):
    """(review 29) A local command's shell exited at once, leaving a child of its in a session of its own
    (`setsid`) that kept the output open: asyncio collected the shell, and at the time limit the group's end
    (SIGTERM, SIGKILL, a wait for its processes) went by the shell's number, free since, which another process's
    group may lead by then (another sample's command, or any process of the host: the runner is root). The shell's
    zombie now holds its number until its group is done with: a group leader made with it (ns_last_pid) lives on,
    or none can be made. The honest twin: a background child in the command's own group goes with the limit."""
    leader = None

    async def body():
        nonlocal leader
        env = await backend_for(settings("local", tmp_path)).open({})
        try:
            # Its group's number: the shell's process group (field 5 of its stat; its name `sh` has no space).
            attack = asyncio.create_task(env.exec("cut -d' ' -f5 /proc/$$/stat > group; setsid sleep 31.5 &", 3))
            written = Path(env.cwd) / "group"
            while not written.exists() or not written.read_text().strip():
                await asyncio.sleep(0.05)
            number = int(written.read_text())
            while state(number) not in ("Z", None):  # the shell exits at once
                await asyncio.sleep(0.05)
            held = state(number)
            leader = await asyncio.to_thread(_group_leader_at, number)
            timed_out = await attack
            twin = await env.exec("sleep 32.5 & echo started", 1)
            return held, timed_out, twin, _running("sleep 32.5")
        finally:
            await env.close()

    try:
        held, timed_out, twin, left = asyncio.run(body())
    finally:
        _let_go(leader)
    assert timed_out.timed_out and twin.timed_out and twin.output.startswith("started") and left == 0
    assert held == "Z", held  # the shell's zombie, uncollected while its group may be signalled
    assert leader is None or leader.returncode is None, leader.returncode


def _let_go(leader: subprocess.Popen | None) -> None:
    """The group leader made at a freed number ended, its returncode left as it was before (None: it lived on)."""
    if leader is not None:
        left = leader.poll()
        leader.kill()
        leader.wait()
        leader.returncode = left


def _group_leader_at(pid: int) -> subprocess.Popen | None:
    """A process group leader made with the number `pid` (ns_last_pid), else None (not root, or another process
    of the host took it each time)."""
    for _ in range(100):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as handle:
                handle.write(str(pid - 1))
        except OSError:
            return None
        leader = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if leader.pid == pid:
            return leader
        leader.kill()
        leader.wait()
    return None


@pytest.mark.parametrize("together", [True, False])
def test_agent_commands_started_together_share_one_sandbox_and_wait_for_the_one_before(bwrap, tmp_path, together):
    """(review 28) Agent commands started together (a tool of the run's own that gathers them) each made a sandbox:
    the sample kept one, the other ran on past the agent's end (into the verification, where no cgroup ended it:
    a runner that is not root's) and past the sample, its control folder left in /tmp; and a command that waited
    for a sandbox that a timeout then ended raised FileNotFoundError instead of giving its result. They run one
    after another in one sandbox, a new one after the timeout. The honest twin: the same commands one by one."""
    commands = ["sleep 300 > /dev/null 2>&1 & echo a", "sleep 300 > /dev/null 2>&1 & echo b"]

    async def body():
        env = await backend_for(replace(settings("bwrap", tmp_path), command_timeout=2.0)).open({})
        try:
            if together:
                started = await asyncio.gather(*(env.exec(command) for command in commands))
            else:
                started = [await env.exec(command) for command in commands]
            sandboxes = _spawners(env.workspace)
            late = ["sleep 30", "echo after"]
            if together:
                ended = await asyncio.gather(*(env.exec(command) for command in late), return_exceptions=True)
            else:
                ended = [await env.exec(command) for command in late]
            await env.enter_clean_room()
            return started, sandboxes, ended, _spawners(env.workspace)
        finally:
            await env.close()

    started, sandboxes, (slow, after), left = asyncio.run(body())
    assert [done.output for done in started] == ["a\n", "b\n"], started
    assert sandboxes == 1 and left == 0, (sandboxes, left)
    assert isinstance(slow, ExecResult) and slow.timed_out, slow
    assert isinstance(after, ExecResult) and after.output == "after\n", after


# Plants a link to the hidden tests and a FIFO in the workspace, again and again (the escape scan removes them).
PLANT = "for i in $(seq 150); do ln -sfn /tests/test_hidden.py evil; [ -p fifo ] || mkfifo fifo; sleep 0.01; done"


@pytest.mark.parametrize("pending", [True, False])
def test_an_agent_command_waiting_as_the_verification_begins_never_runs(bwrap, tmp_path, pending):
    """(review 30) An agent command waiting for the one before (a tool that starts them together) as the verification
    began found the agent's sandbox gone and the clean room not yet marked: it made a new agent sandbox, which
    planted a link to /tests and a FIFO after the escape scan and before the tests came (there add_tests ended it),
    and the verification read the hidden test through the link. It is refused. The honest twin: the same commands
    one after another before the verification run, and the scan removes what they left."""

    async def body():
        env = await backend_for(settings("bwrap", tmp_path)).open({})
        try:
            await env.exec("true")
            if pending:

                async def verification():
                    await asyncio.sleep(0.3)
                    return await env.enter_clean_room()

                first, planted, note = await asyncio.gather(
                    env.exec("sleep 1; echo first"), env.exec(f"{PLANT}; echo planted"), verification()
                )
            else:
                first, planted = await env.exec("echo first"), await env.exec(f"{PLANT}; echo planted")
                note = await env.enter_clean_room()
            await env.add_tests({"test_hidden.py": b"HIDDEN = 1\n"})
            return first, planted, note, await env.exec("ls; cat evil 2>&1")
        finally:
            await env.close()

    first, planted, note, seen = asyncio.run(body())
    assert "HIDDEN" not in seen.output and "evil" not in seen.output.split() and "fifo" not in seen.output, seen
    if pending:
        assert planted.exit_code == -1 and "verification began" in (planted.error or ""), planted
    else:
        assert (first.output, planted.output) == ("first\n", "planted\n"), (first, planted)
        assert "evil" in note and "fifo" in note, note


def _spawners(workspace: str) -> int:
    """Sandboxes of the sample whose workspace is `workspace`: their spawners (bwrap_session.SPAWNER), there."""
    found = 0
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = path.read_bytes().split(b"\0")
            if argv[0] == b"sh" and f"{CONTROL}/$n.sh".encode() in argv[2]:
                found += os.readlink(path.parent / "cwd") == workspace
    return found


@pytest.mark.parametrize("gone", [True, False])
def test_a_sandbox_that_cannot_start_says_why(bwrap, tmp_path, gone):
    """(review 28) A new sandbox whose bwrap could not start (the agent removed its working folder and ended the
    sandbox's spawner) said only `the command's sandbox ended`: bwrap's own error was on its stderr, never read.
    It says why now; the honest twin, its folder kept, starts a new sandbox there."""
    remove = "cd .. && rm -rf project && " if gone else ""
    end = f"{remove}(sleep 0.3; kill -9 $PPID) > /dev/null 2>&1 &"

    async def body():
        env = await backend_for(settings("bwrap", tmp_path)).open({"cwd": "project"})
        try:
            await env.exec(end)
            await asyncio.sleep(1)
            return await env.exec("echo next")
        finally:
            await env.close()

    done = asyncio.run(body())
    if gone:
        assert done.exit_code == -1 and "Can't chdir" in (done.error or ""), done
    else:
        assert done.output == "next\n" and done.exit_code == 0, done
