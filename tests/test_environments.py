"""The environment contract, run against every backend this machine has (local, bwrap, docker), plus
what can be checked of singularity and modal without them."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid

import pytest
from conftest import tool_results

from trajforge.environments import EnvironmentSettings, ExecResult, backend_for, prepare_run
from trajforge.environments.bwrap import BwrapBackend
from trajforge.environments.modal import ModalBackend, has_credentials, sandbox_options
from trajforge.environments.singularity import SingularityBackend, exec_argv, image_uri, start_argv
from trajforge.errors import SetupError

ALPHA = "batch-runner-test/alpha:1"  # built by .ci/docker-up


def _available(request) -> str:
    if request.param == "bwrap":
        try:
            BwrapBackend.check(EnvironmentSettings(kind="bwrap"))
        except SetupError as exc:
            pytest.skip(f"bwrap cannot run on this machine: {exc}")
    if request.param == "docker":
        request.getfixturevalue("docker_host")
    return request.param


@pytest.fixture(params=["local", "bwrap", "docker"])
def kind(request) -> str:
    return _available(request)


@pytest.fixture(params=["local", "bwrap"])
def workspace_kind(request) -> str:
    """The backends whose prompts get a temporary folder on this machine."""
    return _available(request)


def make_settings(kind: str, tmp_path, **changes) -> EnvironmentSettings:
    base = {"command_timeout": 10.0, "default_image": ALPHA, "run_name": "contract", "run_dir": str(tmp_path)}
    return EnvironmentSettings(kind=kind, **(base | changes))


def sync(coroutine):
    return asyncio.run(coroutine)


async def in_env(settings: EnvironmentSettings, body, entry: dict | None = None):
    env = await backend_for(settings).open(entry or {})
    try:
        return await body(env)
    finally:
        await env.close()


def test_a_command_returns_its_output_and_exit_code(kind, tmp_path):
    async def body(env):
        return await env.exec("echo out; echo err >&2; exit 3")

    result = sync(in_env(make_settings(kind, tmp_path), body))
    assert result == ExecResult("out\nerr\n", 3, None, False)


def test_a_timeout_kills_the_whole_process_group(kind, tmp_path):
    async def body(env):
        started = time.monotonic()
        result = await env.exec("(sleep 2; echo late > late.txt) & sleep 30", timeout=1)
        took = time.monotonic() - started
        await asyncio.sleep(2.5)  # the background child would have written by now
        return result, took, await env.exec("test -e late.txt")

    result, took, late = sync(in_env(make_settings(kind, tmp_path), body))
    assert result.timed_out and result.exit_code == 124 and "timed out after 1s" in result.error
    assert took < 5
    assert late.exit_code == 1, "a child of the timed-out command survived"


def test_a_child_that_outlives_its_shell_goes_with_the_timeout(workspace_kind, tmp_path):
    async def body(env):
        # It holds the output open, so the command runs into its limit (bwrap ends it with the shell's PID namespace).
        await env.exec("(sleep 2; echo late > late.txt) &", timeout=1)
        await asyncio.sleep(2.5)  # the background child would have written by now
        return await env.exec("test -e late.txt")

    late = sync(in_env(make_settings(workspace_kind, tmp_path), body))
    assert late.exit_code == 1, "a child of the timed-out command survived"


def test_a_command_that_closed_its_output_is_awaited_without_spinning(workspace_kind, tmp_path):
    # Its output ends two seconds before it does: the runner waits for its exit without reading an end of
    # file over and over (it spun on one: up to a second of the event loop's CPU per second of such a wait;
    # 0.35 s in 1 s on a busy machine, 1.5 ms without).
    async def body(env):
        await env.exec("true")  # one-off costs of the first command out of the figure
        spent = time.thread_time()
        result = await env.exec("exec >/dev/null 2>&1; sleep 2; exit 4")
        return result, time.thread_time() - spent

    result, spent = sync(in_env(make_settings(workspace_kind, tmp_path), body))
    assert result.exit_code == 4 and spent < 0.1, (result, spent)


def test_the_run_limit_caps_what_the_model_asks_for(kind, tmp_path):
    async def body(env):
        return await env.exec("sleep 5", timeout=600)

    result = sync(in_env(make_settings(kind, tmp_path, command_timeout=1.0), body))
    assert result.timed_out and result.exit_code == 124


def test_output_is_capped_with_a_visible_marker(kind, tmp_path):
    async def body(env):
        return await env.exec("echo first; yes abcdefgh | head -c 200000; echo; echo last")

    output = sync(in_env(make_settings(kind, tmp_path), body)).output
    assert output.startswith("first\n") and output.endswith("last\n")
    assert "bytes of output omitted" in output and len(output) < 40_000


def test_files_written_read_and_seen_by_commands(kind, tmp_path):
    text = "héllo wörld\nline 2\n"

    async def body(env):
        await env.write_file("deep/er/notes.txt", text)
        seen = await env.exec("cat deep/er/notes.txt && printf 'from a command' > made.txt && echo > x.sh")
        made = await env.read_file("made.txt")
        await env.exec("chmod +x x.sh")
        await env.write_file("x.sh", "#!/bin/sh\necho rewritten\n")  # an edit keeps the file's mode
        executable = await env.exec("./x.sh")
        return seen, made, executable, await env.read_file("deep/er/notes.txt")

    seen, made, executable, back = sync(in_env(make_settings(kind, tmp_path), body))
    assert seen.output == text and made == "from a command" and back == text
    assert executable.output == "rewritten\n"


def test_file_errors_are_the_same_in_every_backend(kind, tmp_path):
    async def body(env):
        await env.write_file("folder/inside.txt", b"\x89binary\x00")
        with pytest.raises(FileNotFoundError, match=r"^cannot read missing\.txt: no such file$"):
            await env.read_file("missing.txt")
        with pytest.raises(IsADirectoryError, match=r"^cannot read folder: it is a directory$"):
            await env.read_file("folder")
        with pytest.raises(OSError, match=r"^cannot write folder: "):
            await env.write_file("folder", "x")
        return await env.exec("wc -c < folder/inside.txt; tail -c +2 folder/inside.txt | head -c 6")

    written = sync(in_env(make_settings(kind, tmp_path), body))
    assert written.output.split() == ["8", "binary"]  # bytes written as they are


def test_read_file_refuses_a_file_over_the_limit(kind, tmp_path):
    async def body(env):
        await env.exec("head -c 10000001 /dev/zero > big.bin")
        with pytest.raises(ValueError, match="10000001 bytes"):
            await env.read_file("big.bin")

    sync(in_env(make_settings(kind, tmp_path), body))


def test_a_relative_cwd_is_made_inside_the_workspace(kind, tmp_path):
    async def body(env):
        await env.write_file("here.txt", "x")
        return await env.exec("pwd && ls")

    result = sync(in_env(make_settings(kind, tmp_path), body, {"cwd": "sub/dir"}))
    where, listing = result.output.split("\n", 1)
    assert where.endswith("/sub/dir") and listing == "here.txt\n"


def test_two_prompts_do_not_see_each_other(kind, tmp_path):
    settings = make_settings(kind, tmp_path)
    in_tmp = f"/tmp/first-secret-{uuid.uuid4().hex}.txt"

    async def both():
        backend = backend_for(settings)
        first, second = await asyncio.gather(backend.open({}), backend.open({}))
        try:
            await first.write_file("secret.txt", "first's secret")
            await first.write_file(in_tmp, "first's secret in /tmp")
            where = (await first.exec("pwd")).output.strip()
            listing = await second.exec("ls -a")
            return listing, await second.exec(f"cat {where}/secret.txt"), await second.exec(f"cat {in_tmp}")
        finally:
            await asyncio.gather(first.close(), second.close())

    try:
        listing, by_path, tmp_file = sync(both())
    finally:
        if kind == "local":  # the local backend shares the host's /tmp
            os.remove(in_tmp)
    assert "secret.txt" not in listing.output
    if kind != "local":  # sandboxes also hide the other's files by absolute path, and its /tmp
        assert by_path.exit_code != 0 and tmp_file.exit_code != 0


def _leftovers(kind: str, env) -> list[str]:
    """What of `env` still exists on the machine."""
    if kind == "docker":
        import docker

        # Only containers of that name: listing them all inspects each, and another test may remove one meanwhile.
        names = {c.name for c in docker.from_env().containers.list(all=True, filters={"name": env.name})}
        return [env.name] if env.name in names else []
    paths = [env.workspace] + ([env.tmp] if kind == "bwrap" else [])
    return [path for path in paths if os.path.exists(path)]


def test_close_removes_everything_of_the_prompt(kind, tmp_path):
    async def body():
        env = await backend_for(make_settings(kind, tmp_path)).open({})
        await env.exec("echo x > file.txt")
        before = _leftovers(kind, env)
        await env.close()
        return before, _leftovers(kind, env)

    before, after = sync(body())
    assert before and not after


@pytest.mark.parametrize("keep", [False, True])
def test_a_killed_runs_workspaces_are_removed_on_resume_unless_kept(workspace_kind, tmp_path, keep):
    kind = workspace_kind  # docker's leftovers are containers: see test_docker.py
    settings = make_settings(kind, tmp_path / "run", keep_workspaces=keep)
    another_run = make_settings(kind, tmp_path / "another")
    killed = sync(backend_for(settings).open({}))  # never closed, as when its worker is killed
    running = sync(backend_for(another_run).open({}))
    prepare_run(settings, resume=True)
    assert bool(_leftovers(kind, killed)) == keep
    assert _leftovers(kind, running), "another run's workspace was removed"
    sync(killed.close())
    sync(running.close())
    for path in _leftovers(kind, killed):  # kept on purpose above
        shutil.rmtree(path)


def test_commands_never_see_api_keys(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak-1234")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-leak-5678")

    async def body(env):
        return await env.exec("env")

    output = sync(in_env(make_settings(kind, tmp_path), body)).output
    assert "leak" not in output and "API_KEY" not in output


def test_a_command_and_a_spawned_process_see_their_own_locale(kind, tmp_path):
    """bwrap runs the steps before a command in the C locale (bwrap.CHAIN_LOCALE): the command still sees
    exactly the variables it was given, LC_ALL too (none for a command, a stdio server's own)."""
    show = 'echo "${LC_ALL-none} $LANG"'

    async def body(env):
        spawned = await env.spawn(["sh", "-c", show], {"LC_ALL": "C.UTF-8"})
        try:
            seen = await asyncio.wait_for(spawned.process.stdout.readline(), 30)
        finally:
            await spawned.end()
        return (await env.exec(show)).output, seen.decode()

    settings = make_settings(kind, tmp_path, stdio_servers=True)  # docker: its servers get a container of their own
    command, server = sync(in_env(settings, body))
    assert command == "none C.UTF-8\n"
    assert server == "C.UTF-8 C.UTF-8\n"


# -- bwrap -----------------------------------------------------------------------------------------
@pytest.fixture
def bwrap(tmp_path):
    try:
        BwrapBackend.check(EnvironmentSettings(kind="bwrap"))
    except SetupError as exc:
        pytest.skip(f"bwrap cannot run on this machine: {exc}")


def interfaces(proc_net_dev: str) -> list[str]:
    return [line.split(":")[0].strip() for line in proc_net_dev.splitlines()[2:]]


def test_bwrap_host_is_read_only_with_own_pids_and_no_network(bwrap, tmp_path):
    async def body(env):
        return [await env.exec(c) for c in ("touch /usr/bwrap-probe", "echo $$", "cat /proc/net/dev")]

    touched, pid, network = sync(in_env(make_settings("bwrap", tmp_path), body))
    assert "Read-only file system" in touched.output and not os.path.exists("/usr/bwrap-probe")
    assert int(pid.output) < 10  # a fresh PID namespace
    assert interfaces(network.output) == ["lo"]


def test_missing_bwrap_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SetupError, match="needs bubblewrap"):
        BwrapBackend.check(EnvironmentSettings(kind="bwrap"))


def test_an_unknown_environment_is_refused_before_any_request(run_here, server):
    result = run_here([{"prompt": "hi"}], "--environment=kubernetes")
    assert result.code == 2 and "--environment must be one of auto, local, bwrap, docker" in result.stderr
    assert not server.chat_requests()


def test_a_run_under_bwrap(bwrap, run_here):
    entries = [{"prompt": "one"}, {"prompt": "two", "cwd": "project"}]
    result = run_here(entries, "--environment=bwrap", "--distribution=terminal_only")
    assert result.code == 0, result.stderr
    outputs = {t["prompt_index"]: tool_results(t) for t in result.trajectories}
    assert "mock-model-was-here" in outputs[0] and "/project" in outputs[1]


# -- singularity and modal: no apptainer and no Modal account here, so arguments and errors only ---
def test_singularity_instance_arguments(tmp_path):
    settings = make_settings("singularity", tmp_path, default_image="python:3.11-slim")
    argv = start_argv("apptainer", settings, "python:3.11-slim", "batch-runner-x-1", "/tmp/ws")
    assert argv[:3] == ["apptainer", "instance", "start"]
    assert argv[-2:] == ["docker://python:3.11-slim", "batch-runner-x-1"]
    assert "--containall" in argv and "--writable-tmpfs" in argv
    assert argv[argv.index("--net") : argv.index("--net") + 3] == ["--net", "--network", "none"]
    assert argv[argv.index("--bind") + 1] == "/tmp/ws:/workspace"
    online = start_argv("apptainer", make_settings("singularity", tmp_path, sandbox_network=True), "x", "n", "/w")
    assert "--net" not in online
    assert exec_argv("singularity", "n", "/srv", ["sh", "-c", "ls"]) == [
        "singularity",
        "exec",
        "--cleanenv",
        "--pwd",
        "/srv",
        "instance://n",
        "sh",
        "-c",
        "ls",
    ]
    assert image_uri("library://a/b") == "library://a/b" and image_uri("/images/x.sif") == "/images/x.sif"


def test_missing_apptainer_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    settings = make_settings("singularity", tmp_path)
    with pytest.raises(SetupError, match="needs apptainer"):
        SingularityBackend.check(settings)
    with pytest.raises(SetupError, match="needs apptainer"):
        sync(SingularityBackend(settings).open({"prompt": "x"}))


def test_modal_sandbox_options(tmp_path):
    offline = sandbox_options(make_settings("modal", tmp_path))
    assert offline["block_network"] is True and offline["timeout"] > 3600
    assert offline["tags"] == {"batch_runner_run": make_settings("modal", tmp_path).run_tag}
    assert sandbox_options(make_settings("modal", tmp_path, sandbox_network=True))["block_network"] is False


def test_modal_credentials_and_missing_sdk_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_CONFIG_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert not has_credentials({})
    assert has_credentials({"MODAL_TOKEN_ID": "ak-1", "MODAL_TOKEN_SECRET": "as-2"})
    (tmp_path / "modal.toml").write_text("[default]\n")
    assert has_credentials({"MODAL_CONFIG_PATH": str(tmp_path / "modal.toml")})
    with pytest.raises(SetupError, match=r"pip install modal|modal token new"):
        ModalBackend.check(make_settings("modal", tmp_path))
