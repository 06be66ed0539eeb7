"""--mcp_config (trajforge/tools/mcp/): MCP servers written with the official SDK (tests/mcp_servers/) as
toolsets, called by the scripted model through the real runner. A stdio server runs per sample in its
sandbox (its state is the sample's own; it and its children are gone after the run; in bwrap it is the
sandbox's uid, without network unless --sandbox_network; in docker a process of the sample's container,
with pipes over an exec, the files it reads copied in read-only, its process group ended with it); an HTTP
server is shared by every sample; the allowlist; a clash refused, or prefixed; a server that fails to start
(for one sample: it fails with the server's stderr, no request for it; at the run's start: exit 2); a call
that hangs is a tool error after --command_timeout and the sample goes on; the values of a server's env are
written nowhere."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import docker
import pytest
from conftest import tool_results, wait_for
from mcp_servers import readable_sdk as readable_sdk_copy
from test_docker import ALPHA, HARBOR_BASE, built, containers_of
from test_sandbox import bwrap  # noqa: F401  (the fixture)

from trajforge.environments import EnvironmentSettings
from trajforge.environments.docker import RUN_DIR_LABEL, DockerBackend
from trajforge.environments.limits import NOBODY
from trajforge.environments.netns import PASTA_HOST_UID
from trajforge.environments.userns import VERIFIER_HOST_UID

KV = Path(__file__).parent / "mcp_servers" / "kv_server.py"
LOCAL = ("--distribution=terminal_only", "--environment=local")
# Runs are in this process (`run_here`: the same entry point, the workers forked from here) unless a test
# reads the whole console, the workers' output included (a secret or a Traceback nowhere in it): those start
# batch_runner.py as a process (`run`). The Ray workers' run of WORLDS is test_ray.py's, on its cluster.


def call(*calls: tuple) -> str:
    """The mock directive calling each (tool, arguments) in turn."""
    return "[mock call=" + ",".join(f"{name}:{quote(json.dumps(args), safe='')}" for name, args in calls) + "]"


def stdio_config(folder: Path, name: str = "kv", python: str = sys.executable, script: Path = KV, **extra) -> Path:
    """`script` (kv_server.py) copied into `folder` (its path marks its processes) and a config starting it there."""
    shutil.copy(script, folder / script.name)
    config = folder / f"{name}.json"
    server = {"command": python, "args": [script.name], **extra}
    config.write_text(json.dumps({"mcpServers": {name: server}}))
    return config


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and str(os.getpid()) != pid:
            found.append(f"{pid}: {cmdline}")
    return found


def test_a_stdio_server_s_state_is_its_sample_s_and_nothing_of_it_outlives_the_run(run, server, tmp_path):
    config = stdio_config(tmp_path, env={"KV_TOKEN": "kv-secret-value-4711"})
    marker = f"mcp-child-{os.getpid()}"
    entries = [
        {
            "prompt": call(
                ("put", {"key": "a", "value": "one"}), ("get", {"key": "a"}), ("spawn_child", {"marker": marker})
            )
        },
        {"prompt": call(("get", {"key": "a"}), ("variable", {"name": "KV_TOKEN"})) + " another sample"},
        {"prompt": "[mock calls=1] no kv tool"},
    ]
    result = run(entries, f"--mcp_config={config}", *LOCAL)
    assert result.code == 0, result.stderr
    rows = sorted(result.trajectories, key=lambda row: row["prompt_index"])
    stored, other, idle = rows
    assert '"result": "stored a"' in tool_results(stored) and '"result": "one"' in tool_results(stored)
    assert '"result": "no value for a"' in tool_results(other)  # its own server: nothing stored there
    assert (
        '"result": "[redacted]"' in tool_results(other) and other["tool_stats"]["variable"]["success"] == 1
    )  # it got its env
    assert stored["tool_stats"]["get"] == {"count": 1, "success": 1, "failure": 0}
    assert idle["tool_stats"]["put"] == {"count": 0, "success": 0, "failure": 0}  # offered, not called
    assert len({tuple(row["tool_stats"]) for row in rows}) == 1 and "whoami" in idle["tool_stats"]
    assert all("kv" in row["toolsets_used"] for row in rows)
    assert '"name": "put"' in idle["conversations"][0]["value"]  # the server's schema, offered
    # The server and the child it started outside its process group are gone with the run.
    assert not processes_mentioning(str(tmp_path / "kv_server.py")) and not processes_mentioning(marker)
    kept = json.loads((result.run_dir / "run.json").read_text())["mcp_config"]
    assert kept[0]["path"] == str(config) and kept[0]["sha256"].startswith("sha256:")
    written = "".join(path.read_text(errors="replace") for path in result.run_dir.rglob("*") if path.is_file())
    assert "kv-secret-value-4711" not in written + result.stdout + result.stderr


def test_a_call_that_hangs_is_a_tool_error_after_the_command_timeout_and_the_sample_goes_on(run_here, server, tmp_path):
    config = stdio_config(tmp_path)
    entries = [{"prompt": call(("hang", {"seconds": 60}), ("put", {"key": "k", "value": "v"}), ("get", {"key": "k"}))}]
    started = time.monotonic()
    result = run_here(entries, f"--mcp_config={config}", *LOCAL, "--command_timeout=2")
    assert result.code == 0, result.stderr
    assert time.monotonic() - started < 50
    (row,) = result.trajectories
    assert row["tool_stats"]["hang"] == {"count": 1, "success": 0, "failure": 1}
    assert "did not answer within 2 s (--command_timeout)" in tool_results(row)
    assert '"result": "v"' in tool_results(row) and row["completed"]


def test_a_hostile_server_gets_no_model_call_and_its_huge_result_is_capped(run_here, server, tmp_path):
    config = stdio_config(tmp_path)
    calls = [("ask_model", {"question": "spend the key"}), ("big", {"size": 1_000_000})]
    calls += [("big", {"size": 5_000_000}), ("get", {"key": "a"})]  # a message over 4 MB ends the connection
    result = run_here([{"prompt": call(*calls)}], f"--mcp_config={config}", *LOCAL)
    assert result.code == 0, result.stderr
    (row,) = result.trajectories
    results = tool_results(row)
    assert '"result": "refused: ' in results and "the client's model answered" not in results
    assert len(server.chat_requests()) == row["api_calls"]  # the agent's own calls: none for the server
    assert "bytes of output omitted" in results and len(results) < 300_000  # the first big one, capped
    assert row["tool_stats"]["big"] == {"count": 2, "success": 1, "failure": 1}
    assert results.count(f"it sent a message of more than {4 << 20} bytes") == 2  # that call, and every later one
    assert row["tool_stats"]["get"]["failure"] == 1 and row["completed"]


def test_a_server_that_fails_to_start_fails_its_sample_with_its_stderr_and_no_request(run_here, server, tmp_path):
    config = stdio_config(tmp_path)
    entries = [
        {"prompt": call(("get", {"key": "a"})) + " refused", "files": {"refuse_to_start": ""}},
        {"prompt": call(("get", {"key": "a"})) + " fine"},
    ]
    result = run_here(entries, f"--mcp_config={config}", *LOCAL)
    assert result.code == 1, result.stderr
    (failed,) = result.jsonl("errors.jsonl")
    assert failed["prompt_index"] == 0
    assert "MCP server 'kv'" in failed["message"] and "refusing to start in this workspace" in failed["message"]
    assert [row["prompt_index"] for row in result.trajectories] == [1]
    assert not any("refused" in json.dumps(request) for request in server.chat_requests())


def test_a_server_that_cannot_start_at_all_stops_the_run_before_any_request(run_here, server, tmp_path):
    config = tmp_path / "broken.json"
    script = "import sys; sys.stderr.write('kv: no database here\\n'); sys.exit(3)"
    config.write_text(json.dumps({"mcpServers": {"kv": {"command": sys.executable, "args": ["-c", script]}}}))
    result = run_here([{"prompt": "hi"}], f"--mcp_config={config}", *LOCAL)
    assert result.code == 2 and "MCP server 'kv'" in result.stderr and "no database here" in result.stderr
    assert not server.chat_requests()


def test_the_allowlist_offers_only_what_it_names_and_a_clash_is_refused_unless_prefixed(run_here, server, tmp_path):
    stdio_config(tmp_path)
    command = {"command": sys.executable, "args": ["kv_server.py"]}
    allowed = tmp_path / "allowed.json"
    allowed.write_text(json.dumps({"mcpServers": {"kv": {**command, "tools": ["get"]}}}))
    result = run_here([{"prompt": call(("get", {"key": "a"}))}], f"--mcp_config={allowed}", *LOCAL, run_name="allowed")
    assert result.code == 0, result.stderr
    (row,) = result.trajectories
    assert "get" in row["tool_stats"] and "put" not in row["tool_stats"]
    assert '"name": "put"' not in row["conversations"][0]["value"]
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"mcpServers": {"kv": {**command, "tools": ["get", "delete"]}}}))
    refused = run_here([{"prompt": "hi"}], f"--mcp_config={missing}", *LOCAL, run_name="missing")
    assert refused.code == 2 and "has no tool 'delete'" in refused.stderr
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"mcpServers": {"kv": command, "kv2": command}}))
    clash = run_here([{"prompt": "hi"}], f"--mcp_config={twice}", *LOCAL, run_name="clash")
    assert clash.code == 2 and "is in two toolsets: 'kv'" in clash.stderr and "'kv2'" in clash.stderr
    prefixed = tmp_path / "prefixed.json"
    prefixed.write_text(json.dumps({"mcpServers": {"kv": command, "kv2": {**command, "prefix": True}}}))
    entries = [{"prompt": call(("put", {"key": "a", "value": "1"}), ("kv2__get", {"key": "a"}))}]
    both = run_here(entries, f"--mcp_config={prefixed}", *LOCAL, run_name="prefixed")
    assert both.code == 0, both.stderr
    (row,) = both.trajectories
    assert row["tool_stats"]["kv2__get"]["success"] == 1 and '"result": "no value for a"' in tool_results(row)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def http_server(tmp_path):
    port = free_port()
    process = subprocess.Popen([sys.executable, str(KV), "http", str(port)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_for(listening, 30, "the HTTP MCP server")
    yield url
    process.terminate()
    process.wait(10)


def test_an_http_server_is_shared_by_every_sample(run_here, server, tmp_path, http_server):
    config = tmp_path / "http.json"
    config.write_text(json.dumps({"mcpServers": {"shared": {"url": http_server}}}))
    first = run_here([{"prompt": call(("put", {"key": "a", "value": "shared"}))}], f"--mcp_config={config}", *LOCAL)
    assert first.code == 0, first.stderr
    second = run_here([{"prompt": call(("get", {"key": "a"}))}], f"--mcp_config={config}", *LOCAL, run_name="second")
    assert second.code == 0, second.stderr
    (row,) = second.trajectories
    assert '"result": "shared"' in tool_results(row) and row["toolsets_used"] == ["file", "shared", "terminal"]


# -- in bwrap --------------------------------------------------------------------------------------------


# Of the session, not the module: xdist hands this module's tests out one by one, and a worker that ran another
# module's meanwhile copied the SDK again (48 MB, 4 s) for its next test here.
@pytest.fixture(scope="session")
def readable_sdk():
    """A folder every uid may read with the SDK for the system's Python (mcp_servers/readable_sdk.py)."""
    if not readable_sdk_copy.system_python_fits():
        pytest.skip("no system Python of this version to run the SDK's compiled modules in the sandbox")
    folder = Path(tempfile.mkdtemp(prefix="batch-runner-test-mcp-"))
    sdk = readable_sdk_copy.copy_sdk(folder)
    shutil.copy(KV, folder / "kv_server.py")
    os.chmod(folder / "kv_server.py", 0o644)
    yield folder, sdk
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.usefixtures("bwrap")
def test_in_bwrap_a_server_is_the_sandbox_s_uid_without_network_unless_sandbox_network(
    run_here, server, tmp_path, readable_sdk
):
    folder, sdk = readable_sdk
    config = folder / f"kv-{tmp_path.name}.json"
    server_spec = {
        "command": readable_sdk_copy.SYSTEM_PYTHON,
        "args": ["kv_server.py"],
        "env": {"PYTHONPATH": str(sdk)},
        "readable": [str(sdk)],
    }
    config.write_text(json.dumps({"mcpServers": {"kv": server_spec}}))
    port = 20000 + os.getpid() % 10000
    connect = (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('reached')\""
    )
    with socket.socket() as listener:  # on the host's loopback: reached only through the host's network
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        host_port = listener.getsockname()[1]
        probe = call(
            ("terminal", {"command": "id -u"}),
            ("whoami", {}),
            ("reach", {"host": "127.0.0.1", "port": host_port}),
            ("listen", {"port": port}),
            ("terminal", {"command": connect}),
        )
        flags = (f"--mcp_config={config}", "--distribution=terminal_only", "--environment=bwrap")
        closed = run_here([{"prompt": probe}], *flags, run_name="closed")
        opened = run_here([{"prompt": probe}], *flags, "--sandbox_network=True", run_name="opened")
    for result in (closed, opened):
        assert result.code == 0, result.stderr
    (row,) = closed.trajectories
    results = tool_results(row)
    assert '"output": "1000\\n"' in results  # the sample's commands' uid: the sandbox's
    assert '"result": "uid=1000 pid=' in results  # the server's
    assert "no connection" in results  # nothing of the host's network
    assert "reached" not in results  # nor the sample's commands' (each has a network namespace of its own)
    (row,) = opened.trajectories
    results = tool_results(row)
    # With --sandbox_network, the sample's network namespace (outward only: not the host's loopback) is the
    # server's too: a command of the sample reaches what the server listens on.
    assert "no connection" in results and "reached" in results
    assert not processes_mentioning(str(config))


def test_what_the_dataset_or_the_agent_writes_in_the_workspace_never_runs_as_the_server(run_here, server, tmp_path):
    """A `python -m` server looks for modules in its working folder first: a dataset's kv_server.py would
    replace it, a statistics.py the agent writes would run in it at its first lazy import (with its env's
    secrets). It starts in /, the workspace in MCP_WORKSPACE, without the working folder on sys.path."""
    stdio_config(tmp_path)
    config = tmp_path / "module.json"
    module = {"command": sys.executable, "args": ["-m", "kv_server"], "env": {"PYTHONPATH": str(tmp_path)}}
    config.write_text(json.dumps({"mcpServers": {"kv": module}}))
    planted_server = "import sys\nsys.exit('the dataset planted kv_server.py')\n"
    plant = "echo 'def mean(numbers): return \"planted\"' > statistics.py"
    numbers = ("mean", {"numbers": [1, 2, 3]})
    entries = [
        {"prompt": call(("get", {"key": "a"})) + " dataset", "files": {"kv_server.py": planted_server}},
        {"prompt": call(("terminal", {"command": plant}), numbers) + " agent"},
        {"prompt": call(numbers, ("workspace_file", {"name": "data.txt"})) + " honest", "files": {"data.txt": "hi"}},
    ]
    result = run_here(entries, f"--mcp_config={config}", *LOCAL)
    assert result.code == 0, result.stderr
    dataset, agent, honest = sorted(result.trajectories, key=lambda row: row["prompt_index"])
    assert '"result": "no value for a"' in tool_results(dataset)  # the configured server, not the dataset's
    assert '"result": "2.0"' in tool_results(agent) and "planted" not in tool_results(agent)
    assert '"result": "2.0"' in tool_results(honest) and '"result": "hi"' in tool_results(honest)  # reaches it


# -- in docker -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mcp_image(docker_host, readable_sdk) -> str:
    """HARBOR_BASE with the SDK at /opt/mcp-sdk and the libraries its compiled modules load: an image a
    stdio server runs in, built offline once for this SDK."""
    _, sdk = readable_sdk
    files = sorted(path for path in sdk.rglob("*") if path.is_file())
    listed = "".join(f"{path.relative_to(sdk)} {path.stat().st_size}\n" for path in files)
    tag = f"batch-runner-test/harbor-mcp:{hashlib.sha256(listed.encode()).hexdigest()[:12]}"
    client = docker.from_env()
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(tag)
        return tag
    libraries = set()
    for path in (path for path in files if ".so" in path.name):
        loaded = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
        libraries.update(re.findall(r"=> (/\S+)", loaded))
    dockerfile = f"FROM {HARBOR_BASE}\nCOPY sdk /opt/mcp-sdk\nCOPY root/ /\n".encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as context:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        context.addfile(info, io.BytesIO(dockerfile))
        context.add(sdk, "sdk")
        for library in libraries:
            context.add(os.path.realpath(library), f"root{library}")
    client.images.build(fileobj=io.BytesIO(buffer.getvalue()), custom_context=True, tag=tag, network_mode="none")
    return tag


def server_settings(tmp_path: Path, name: str, image: str = ALPHA) -> EnvironmentSettings:
    """A docker run's settings, `name` its run's, with a stdio server (its samples' servers get a container)."""
    return EnvironmentSettings(
        kind="docker",
        command_timeout=10.0,
        default_image=image,
        run_name=name,
        run_dir=str(tmp_path),
        stdio_servers=True,
    )


def test_in_docker_a_spawned_process_has_pipes_reads_its_files_and_ends_with_its_group(docker_host, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "data.txt").write_text("from the host\n")
    settings = server_settings(tmp_path, "spawn")
    line = b"x" * 300_000 + b"\n"  # one line of many of Docker's frames, more than asyncio's default limit

    async def body() -> tuple:
        env = await DockerBackend(settings).open({})
        try:
            script = 'echo "$GREETING" >&2; sleep 300 & exec cat'  # the sleep: of its process group
            spawned = await env.spawn(["sh", "-c", script], {"GREETING": "hi on stderr"}, (str(served),), 1 << 20)
            process = spawned.process
            process.stdin.write(line)
            await process.stdin.drain()
            echoed, said = await process.stdout.readline(), await process.stderr.readline()
            data = f"{served}/data.txt"
            attack = f"cat {data}; stat -c '%a %u' {data} {served}; echo no > {data} || chmod 666 {data} || echo kept"
            servers = docker.from_env().containers.get(env.servers)  # the servers' own container
            seen, agents = (
                servers.exec_run(["sh", "-c", attack], user="0").output.decode(),
                (await env.exec(attack)).output,
            )
            running, agent_running = servers.exec_run("ps").output.decode(), (await env.exec("ps")).output
            await spawned.end()
            after = servers.exec_run("ps").output.decode()
            ends = await env.spawn(["sh", "-c", "cat; exit 7"], {})  # ends by itself once its stdin ends
            ends.process.stdin.write(b"bye\n")
            await ends.process.stdin.drain()
            ends.process.stdin.close()
            rest = await asyncio.wait_for(ends.process.stdout.read(), 30)
            await ends.end()
            flood = await env.spawn(["cat", "/dev/zero"], {}, limit=1 << 16)  # one endless line
            with pytest.raises(ValueError):  # longer than the limit: the connection ends there
                await flood.process.stdout.readline()
            await asyncio.sleep(2)  # it goes on writing as fast as it can; nobody reads
            held = len(flood.process.stdout._buffer)  # what asyncio's reader holds: no more than it takes in
            await asyncio.wait_for(flood.end(), 10)
            ends_output = (rest, process.returncode, ends.process.returncode, held)
            return echoed, said, seen, agents, running, agent_running, after, ends_output
        finally:
            await env.close()

    echoed, said, seen, agents, running, agent_running, after, ends_output = asyncio.run(body())
    rest, killed, exited, held = ends_output
    assert echoed == line and said == b"hi on stderr\n"  # stdout whole; stderr its own, without the pid line
    # Readable at the same path in the servers' container, owned by nobody, read-only: its root, without
    # capabilities, can neither write nor chmod it; the agent's container has none of it.
    assert "from the host" in seen and "444 65534" in seen and "555 65534" in seen and "kept" in seen
    assert "from the host" not in agents and "No such file" in agents
    assert "sleep 300" in running and "sleep 300" not in after and " cat" not in after  # its whole group
    assert "sleep 300" not in agent_running  # the servers' processes are not even seen by the agent
    assert killed is not None and rest == b"bye\n" and exited == 7  # killed: cat ends on stdin's end, or SIGKILL
    assert held < 1 << 20  # reading paused at twice the limit, not gigabytes of a flood in the worker's memory
    assert not containers_of(tmp_path)


def test_in_docker_the_agent_can_neither_read_nor_signal_its_server(docker_host, tmp_path):
    """The server runs as a uid of its own in a container of its own: the agent (the image's root, without
    capabilities) cannot read its environment, nor even see it; the server still reads the workspace (the
    agent's files) and what the config gave it, and the agent still reads its own environment."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "data.txt").write_text("from the host\n")
    settings = server_settings(tmp_path, "spy")
    spy = (
        "for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null; done | tr '\\0' '\\n' | grep -c SERVER_SECRET; "
        "SERVER_SECRET=own cat /proc/self/environ | tr '\\0' '\\n' | grep -c SERVER_SECRET=own"
    )

    async def body() -> tuple:
        env = await DockerBackend(settings).open({})
        try:
            await env.exec("echo in-the-workspace > note.txt")
            script = f'cat note.txt {served}/data.txt; echo "$SERVER_SECRET"; id -u; exec cat'
            spawned = await env.spawn(["sh", "-c", script], {"SERVER_SECRET": "s3cret-4711"}, (str(served),))
            said = [(await spawned.process.stdout.readline()).decode().strip() for _ in range(4)]
            seen = (await env.exec(spy)).output.split()
            agent = (await env.exec("id -u")).output.strip()
            servers = docker.from_env().containers.get(env.servers)
            running, agents = servers.exec_run("ps").output.decode(), (await env.exec("ps")).output
            await spawned.end()
            return said, seen, agent, running, agents, servers.exec_run("ps").output.decode()
        finally:
            await env.close()

    said, seen, agent, running, agents, after = asyncio.run(body())
    assert said[:3] == ["in-the-workspace", "from the host", "s3cret-4711"] and said[3] != agent, said
    # Nor a uid the runner gives a meaning on the host (a container's uid is the host's): the owner of the bwrap
    # workers' two-uid namespaces, pasta's, nobody's (review 18).
    assert int(said[3]) not in (VERIFIER_HOST_UID, PASTA_HOST_UID, NOBODY), said
    assert seen == ["0", "1"], seen  # no environ of the server read; its own environ read
    assert " cat" in running and " cat" not in after  # alive until ended, then gone with its group
    assert " cat" not in agents  # not even seen by the agent


# Images whose user and group are SERVER_UIDS' first, 65531: one with busybox's `id`, one whose sh (bash) finds none.
USER_65531 = {
    "with id": f"FROM {HARBOR_BASE}\nUSER 65531:65531\n",
    "without id": f"FROM {HARBOR_BASE}\n"
    'RUN ["/bin/busybox", "sh", "-c", "rm /bin/id && ln -sf bash /bin/sh"]\nUSER 65531:65531\n',
    "its group only": f"FROM {HARBOR_BASE}\nUSER 1000:65531\n",  # a server of that gid shares its files' group
}
# The image's user by name (Docker looks it up in the container's /etc/passwd at each exec) and by number.
USER_ROOT = {"by name": f"FROM {HARBOR_BASE}\nUSER root\n", "by number": f"FROM {HARBOR_BASE}\nUSER 0:0\n"}
OWN_UID = 'while read -r k v _; do [ "$k" = Uid: ] && echo "$v"; done < /proc/self/status'  # who runs it
ENVIRON_SPY = "for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null; done | tr '\\0' '\\n' | grep -c SERVER_SECRET"


def image_settings(tmp_path: Path, name: str, dockerfile: str) -> EnvironmentSettings:
    """A docker run's settings whose image is `dockerfile`, built once (batch-runner-test/NAME:its digest)."""
    tag = built(f"batch-runner-test/{name}:{hashlib.sha256(dockerfile.encode()).hexdigest()[:12]}", dockerfile)
    return server_settings(tmp_path, "uid", tag)


async def secret_server(env) -> tuple:
    """A server with a secret in its environment that leaves a note its group may read, and the uid it said."""
    note = "umask 027; echo server-note > /tmp/server-note"
    spawned = await env.spawn(["sh", "-c", f"{OWN_UID}; {note}; exec cat"], {"SERVER_SECRET": "s3cret-4711"})
    return spawned, (await spawned.process.stdout.readline()).decode().strip()


@pytest.mark.parametrize("image", USER_65531)
def test_in_docker_a_server_never_runs_as_the_image_s_user(docker_host, tmp_path, image):
    """The server's uid is the next of SERVER_UIDS (65530) where the image's user has the first as its uid or
    gid, found by the shell itself whether or not the image has an `id`: without one, `id -u` answered "not
    found", taken for another uid, and the server ran as the agent's, whose commands read its environment; of
    the agent's gid, the server's files its group may read were the agent's to read (review 19)."""
    settings = image_settings(tmp_path, "user-65531", USER_65531[image])
    spy = f"{ENVIRON_SPY}; kill -0 $0 2>/dev/null && echo signalled; cat /tmp/server-note 2>/dev/null"

    async def body() -> tuple:
        env = await DockerBackend(settings).open({})
        try:
            spawned, server = await secret_server(env)
            pid = await spawned.process.pid
            agent, seen = (await env.exec(OWN_UID)).output.strip(), (await env.exec(spy.replace("$0", pid))).output
            has_id = (await env.exec("id -u")).exit_code == 0
            await spawned.end()
            return server, agent, seen, has_id
        finally:
            await env.close()

    server, agent, seen, has_id = asyncio.run(body())
    assert has_id == (image != "without id")
    expected = "1000" if image == "its group only" else "65531"
    assert (server, agent, seen.split()) == ("65530", expected, ["0"])  # no environ read, no signal, no note


@pytest.mark.parametrize("image", USER_ROOT)
def test_in_docker_the_agent_cannot_become_its_server_s_uid_by_rewriting_etc_passwd(docker_host, tmp_path, image):
    """Review 19: with `USER root` Docker looked root up in /etc/passwd at each of the agent's execs, which the
    agent (root: the file's owner) rewrote as `root:x:65531:...`; its next command ran as the server's uid and
    read the server's environment. The agent's uid:gid is told in numbers at the start and pinned."""
    settings = image_settings(tmp_path, "user-root", USER_ROOT[image])
    rewrite = "sed -i 's/^root:x:0:0:/root:x:65531:65531:/' /etc/passwd && grep -c ^root:x:65531 /etc/passwd"

    async def body() -> tuple:
        env = await DockerBackend(settings).open({})
        try:
            spawned, server = await secret_server(env)
            before = (await env.exec(OWN_UID)).output.strip()
            rewritten = (await env.exec(rewrite)).output.strip()
            after, seen = (await env.exec(OWN_UID)).output.strip(), (await env.exec(ENVIRON_SPY)).output.strip()
            await spawned.end()
            return server, before, rewritten, after, seen
        finally:
            await env.close()

    assert asyncio.run(body()) == ("65531", "0", "1", "0", "0")


def test_in_docker_what_a_config_gives_its_server_never_lies_in_the_work_folder(docker_host, tmp_path):
    """The files a config gives its server (`readable`, the script beside it) are copied into the servers' container
    at their host paths. One at or above the work folder's path there would land in the work folder's volume,
    the agent's to rewrite before the server reads it (review 26 had not checked it): its server does not start.
    The honest twin: a folder beside the work folder is the server's alone."""
    tag = built("batch-runner-test/workdir-tmp:1", f"FROM {ALPHA}\nWORKDIR /tmp\n")
    settings = server_settings(tmp_path, "overlap", tag)
    work, beside = tmp_path / "work", tmp_path / "served"  # the work folder is the host's path in the container too
    for folder in (work / "config", beside):
        folder.mkdir(parents=True)
        (folder / "data.txt").write_text(f"from {folder.name}\n")

    async def body() -> bytes:
        env = await DockerBackend(settings).open({"cwd": str(work)})
        try:
            for hostile in (work / "config", tmp_path):  # in the work folder, or above it
                with pytest.raises(OSError, match="overlap"):
                    await env.spawn(["cat"], {}, (str(hostile),))
            spawned = await env.spawn(["sh", "-c", f"cat {beside}/data.txt; exec cat"], {}, (str(beside),))
            line = await spawned.process.stdout.readline()
            await spawned.end()
            return line
        finally:
            await env.close()

    assert asyncio.run(body()) == b"from served\n"
    assert not containers_of(tmp_path)


def test_in_docker_the_servers_container_shares_the_work_folder_alone_not_an_image_s_volume(docker_host, tmp_path):
    """Review 26: the servers' container took the agent's volumes with volumes_from, an image's VOLUME (/opt/lib)
    too: a module the agent wrote there was the server's to import. It mounts the work folder's volume alone, as
    the agent left it: the image's file the agent removed is not filled in again. The honest twin: the agent's
    file in the work folder is the server's to read."""
    dockerfile = (
        f"FROM {HARBOR_BASE}\nRUN mkdir -p /opt/lib /app && echo image > /app/keep.txt\nVOLUME /opt/lib\nWORKDIR /app\n"
    )
    settings = image_settings(tmp_path, "image-volume", dockerfile)
    agent = "echo planted > /opt/lib/mod.py && rm keep.txt && echo from-the-agent > note.txt && ls /opt/lib"
    script = "cat /opt/lib/mod.py note.txt keep.txt 2>&1; echo end; exec cat"

    async def body() -> tuple:
        env = await DockerBackend(settings).open({})
        try:
            planted = (await env.exec(agent)).output
            spawned = await env.spawn(["sh", "-c", script], {})
            said = []
            while not said or said[-1] != "end":
                said.append((await spawned.process.stdout.readline()).decode().strip())
            await spawned.end()
            return planted, said
        finally:
            await env.close()

    planted, said = asyncio.run(body())
    assert planted.split() == ["mod.py"]
    assert "from-the-agent" in said and "planted" not in said and "image" not in said, said
    assert not containers_of(tmp_path)
    assert not docker.from_env().volumes.list(filters={"label": f"{RUN_DIR_LABEL}={tmp_path}"})


def test_in_docker_a_server_runs_in_the_user_s_image_never_in_an_entry_s(docker_host, tmp_path):
    """Review 27: an entry's `image` is the dataset's, and the servers' container was made from it: the dataset's
    image named what the server's `command` ran (its `python`), with the server's env. The servers run in the
    user's image (--default_image, where the run's start listed their tools), sharing the work folder the agent's
    container has in the entry's image; one outside that image's working directory gets no server. The honest
    twin: an entry naming no image, whose server and agent both see the user's image."""
    marked = "FROM {image}\nRUN echo {mark} > /etc/which-image\nWORKDIR {workdir}\n"
    user = built("batch-runner-test/servers-user:1", marked.format(image=ALPHA, mark="user", workdir="/app"))
    dataset = built("batch-runner-test/servers-dataset:1", marked.format(image=ALPHA, mark="dataset", workdir="/app"))
    elsewhere = built("batch-runner-test/servers-srv:1", marked.format(image=ALPHA, mark="dataset", workdir="/srv"))
    settings = EnvironmentSettings(
        kind="docker",
        command_timeout=10.0,
        default_image=user,
        run_name="servers-image",
        run_dir=str(tmp_path),
        stdio_servers=True,
    )

    async def seen(entry: dict) -> tuple[str, list[str] | str]:
        env = await DockerBackend(settings).open(entry)
        try:
            agent = (await env.exec("cat /etc/which-image && echo from-the-agent > note.txt")).output.strip()
            try:
                spawned = await env.spawn(["sh", "-c", "cat /etc/which-image note.txt; exec cat"], {})
            except OSError as exc:
                return agent, str(exc)
            server = [(await spawned.process.stdout.readline()).decode().strip() for _ in range(2)]
            await spawned.end()
            return agent, server
        finally:
            await env.close()

    assert asyncio.run(seen({})) == ("user", ["user", "from-the-agent"])
    assert asyncio.run(seen({"image": dataset})) == ("dataset", ["user", "from-the-agent"])
    agent, refused = asyncio.run(seen({"image": elsewhere}))
    assert agent == "dataset" and "outside the image's working directory /app" in refused, refused
    assert not containers_of(tmp_path)
    assert not docker.from_env().volumes.list(filters={"label": f"{RUN_DIR_LABEL}={tmp_path}"})


def test_in_docker_an_image_s_volume_in_the_work_folder_is_never_mounted_through_the_agent_s_links(
    docker_host, tmp_path
):
    """Review 27: Docker mounts the servers' image's VOLUME (/app/data) after the work folder's volume (/app), through
    what lies there: where the entry's image has no such VOLUME, the dataset's `data -> /opt/mcp` put it over the
    server's program. Such an image starts no server; the honest twin, its VOLUME beside the work folder, does."""
    marked = (
        "FROM {image}\nRUN mkdir -p {volume} /opt/mcp && echo program > /opt/mcp/prog\nVOLUME {volume}\nWORKDIR /app\n"
    )
    inside = built("batch-runner-test/servers-volume-in:1", marked.format(image=ALPHA, volume="/app/data"))
    beside = built("batch-runner-test/servers-volume-beside:1", marked.format(image=ALPHA, volume="/srv/data"))
    dataset = built("batch-runner-test/servers-no-volume:1", f"FROM {ALPHA}\nWORKDIR /app\n")

    async def seen(user: str) -> str:
        settings = EnvironmentSettings(
            kind="docker", default_image=user, run_name="volume", run_dir=str(tmp_path), stdio_servers=True
        )
        env = await DockerBackend(settings).open({"image": dataset})
        try:
            await env.exec("rm -rf data && ln -s /opt/mcp data")
            try:
                spawned = await env.spawn(["sh", "-c", "cat /opt/mcp/prog 2>&1; exec cat"], {})
            except OSError as exc:
                return str(exc)
            line = (await spawned.process.stdout.readline()).decode().strip()
            await spawned.end()
            return line
        finally:
            await env.close()

    assert asyncio.run(seen(beside)) == "program"
    assert "VOLUME /app/data lies in the work folder /app" in asyncio.run(seen(inside))
    assert not containers_of(tmp_path)
    assert not docker.from_env().volumes.list(filters={"label": f"{RUN_DIR_LABEL}={tmp_path}"})


@pytest.mark.usefixtures("docker_host")
def test_in_docker_a_server_runs_in_each_sample_s_container_and_one_that_fails_fails_its_sample(
    run_here, server, tmp_path, mcp_image
):
    config = stdio_config(tmp_path, python=readable_sdk_copy.SYSTEM_PYTHON, env={"PYTHONPATH": "/opt/mcp-sdk"})
    entries = [
        {
            "prompt": call(
                ("put", {"key": "a", "value": "one"}), ("get", {"key": "a"}), ("variable", {"name": "MCP_WORKSPACE"})
            )
        },
        {"prompt": call(("get", {"key": "a"})) + " another sample"},
        {"prompt": call(("get", {"key": "a"})) + " refused", "files": {"refuse_to_start": ""}},
    ]
    flags = ("--environment=docker", f"--default_image={mcp_image}", "--distribution=terminal_only")
    result = run_here(entries, f"--mcp_config={config}", *flags)
    assert result.code == 1, result.stderr
    rows = {row["prompt_index"]: tool_results(row) for row in result.trajectories}
    assert sorted(rows) == [0, 1]
    assert '"result": "one"' in rows[0] and '"result": "/app"' in rows[0]  # the container's work folder
    assert '"result": "no value for a"' in rows[1]  # its own server: nothing stored there
    (failed,) = result.jsonl("errors.jsonl")
    assert failed["prompt_index"] == 2
    assert "MCP server 'kv'" in failed["message"] and "refusing to start in this workspace" in failed["message"]
    assert not any("refused" in json.dumps(request) for request in server.chat_requests())
    assert not containers_of(result.run_dir) and not processes_mentioning(str(tmp_path / "kv_server.py"))


def test_in_docker_what_the_agent_changes_of_its_image_never_runs_as_its_server(run_here, server, tmp_path, mcp_image):
    """Review 19: the agent is root of its container's files, and a module its server imports late (statistics, at
    the first `mean`) was the agent's to rewrite: it ran as the server, with the server's env, and its answer was
    the tool's result. The servers run in a container of their own, sharing the work folder alone: the agent's
    rewrite stays in its own. The honest twin: the server reads the file the agent wrote in the work folder."""
    python = readable_sdk_copy.SYSTEM_PYTHON
    config = stdio_config(tmp_path, python=python, env={"PYTHONPATH": "/opt/mcp-sdk", "SECRET_TOKEN": "tok-4711"})
    fake = "import os\\ndef mean(numbers): return os.environ.get('SECRET_TOKEN', 'no secret')\\n"
    plant = (
        f'm=$({python} -c "import statistics; print(statistics.__file__)") && printf "{fake}" > "$m" && echo planted'
    )
    steps = (("terminal", {"command": plant}), ("terminal", {"command": "echo from-the-agent > note.txt"}))
    steps += (("workspace_file", {"name": "note.txt"}), ("mean", {"numbers": [1, 2, 3]}))
    flags = ("--environment=docker", f"--default_image={mcp_image}", "--distribution=terminal_only")
    result = run_here(
        [{"prompt": call(*steps), "verify": "grep -q from-the-agent note.txt"}], f"--mcp_config={config}", *flags
    )
    assert result.code == 0, result.stderr
    (row,) = result.trajectories
    results = tool_results(row)
    assert row["metadata"]["verification"]["passed"]  # its fresh container holds the work folder the agent left
    assert "planted" in results and '"result": "from-the-agent' in results  # the rewrite took; the folder is shared
    assert '"result": "2' in results and "tok-4711" not in results, results  # the image's statistics: 2
    assert not containers_of(result.run_dir)
    label = {"label": f"{RUN_DIR_LABEL}={result.run_dir.resolve()}"}
    assert not docker.from_env().volumes.list(filters=label)  # the work folder's volume went with them


def test_in_docker_a_dataset_s_cwd_never_puts_the_work_folder_over_what_its_server_runs(
    run_here, server, tmp_path, mcp_image
):
    """Review 26: with a stdio server the work folder is a volume the servers' container mounts too, at the
    entry's `cwd`, which the dataset names: `"cwd": "/usr/lib/python3.11"` put the agent's volume over the
    server's standard library, and the statistics.py the agent rewrote there ran as the server, with its env
    (its answer the secret reversed, past the redaction). A work folder outside the image's own gets no server,
    nor one inside it reached through a link of the image (Docker follows /app/lib -> /usr/lib to mount it);
    the honest twin, a `cwd` inside the image's WORKDIR (/app), shares it with its server."""
    tag = f"batch-runner-test/mcp-linked:{hashlib.sha256(mcp_image.encode()).hexdigest()[:12]}"
    image = built(tag, f"FROM {mcp_image}\nRUN ln -s /usr/lib /app/lib\nWORKDIR /app\n")
    python = readable_sdk_copy.SYSTEM_PYTHON
    config = stdio_config(tmp_path, python=python, env={"PYTHONPATH": "/opt/mcp-sdk", "SECRET_TOKEN": "tok-4711"})
    fake = "import os\\ndef mean(numbers): return os.environ.get('SECRET_TOKEN', 'no secret')[::-1]\\n"
    plant = f'printf "{fake}" > statistics.py && echo from-the-agent > note.txt && echo planted'
    steps = call(("terminal", {"command": plant}), ("workspace_file", {"name": "note.txt"}), ("mean", {"numbers": [2]}))
    cwds = ["/usr/lib/python3.11", "/app/lib/python3.11", "/app/sub"]
    entries = [{"prompt": f"{steps} {n}", "cwd": cwd} for n, cwd in enumerate(cwds)]
    flags = ("--environment=docker", f"--default_image={image}", "--distribution=terminal_only")
    result = run_here(entries, f"--mcp_config={config}", *flags)
    assert result.code == 1, result.stderr
    (honest,) = result.trajectories
    assert honest["prompt_index"] == 2
    results = tool_results(honest)
    assert '"result": "from-the-agent' in results and '"result": "2' in results, results
    failed = {line["prompt_index"]: line["message"] for line in result.jsonl("errors.jsonl")}
    assert "outside the image's working directory /app" in failed[0]
    assert "reached through a link of the image (/usr/lib/python3.11)" in failed[1], failed
    assert "1174-kot" not in json.dumps(failed)
    assert not containers_of(result.run_dir)


# -- tools listed per sample -------------------------------------------------------------------------------

WORLD = Path(__file__).parent / "mcp_servers" / "world_server.py"


def world(**spec) -> dict:
    """A dataset entry's `files`: the world.json from which world_server.py makes its tools."""
    return {"world.json": json.dumps(spec)}


def offered(row: dict) -> dict:
    """{tool: its parameters} as the row's system turn offers them."""
    system = row["conversations"][0]["value"]
    tools = json.loads(system[system.index("<tools>\n") + len("<tools>\n") : system.index("\n</tools>")])
    return {tool["name"]: tool["parameters"] for tool in tools}


WORLDS = [
    {
        "prompt": call(("north", {"steps": 2}), ("look", {"room": "attic"})),
        "files": world(rooms=["hall", "attic"], tools=["north"]),
    },
    {
        "prompt": call(("south", {"steps": 1}), ("look", {"room": "cellar"})),
        "files": world(rooms=["cellar", "vault"], tools=["south"]),
    },
    {"prompt": "no world.json: the tools of the run's start"},
    {"prompt": call(("terminal", {"command": "true"})) + " clash", "files": world(tools=["terminal"])},
]


def test_each_sample_is_offered_the_tools_its_server_lists_for_it(run_here, server, tmp_path):
    result = run_here(WORLDS, f"--mcp_config={stdio_config(tmp_path, 'world', script=WORLD)}", *LOCAL)
    assert_offered_their_own(result, server)


def assert_offered_their_own(result, server) -> None:
    """WORLDS' run: two samples offered the tools (and schemas) their server listed for each, one the start's,
    one whose listing has another toolset's tool failed before any model call."""
    assert result.code == 1, result.stderr
    (failed,) = result.jsonl("errors.jsonl")  # a name of another toolset: that sample fails, not the run
    assert failed["prompt_index"] == 3
    assert "lists 'terminal' for this sample, a tool of toolset 'terminal'" in failed["message"]
    assert not any("clash" in json.dumps(request) for request in server.chat_requests())
    rows = sorted(result.trajectories, key=lambda row: row["prompt_index"])
    north, south, plain = rows
    assert {"north", "look", "terminal"} <= offered(north).keys() and "south" not in offered(north)
    assert offered(north)["look"]["properties"]["room"]["enum"] == ["hall", "attic"]  # the schema of its listing
    assert "south" in offered(south) and "north" not in offered(south)
    assert offered(south)["look"]["properties"]["room"]["enum"] == ["cellar", "vault"]
    assert offered(plain)["look"]["properties"]["room"]["enum"] == ["hall", "porch"]
    assert not {"north", "south"} & offered(plain).keys()
    assert '"result": "north: walked 2 steps"' in tool_results(north) and "you are in the attic" in tool_results(north)
    assert '"result": "south: walked 1 steps"' in tool_results(south) and "you are in the cellar" in tool_results(south)
    assert north["tool_stats"]["north"] == {"count": 1, "success": 1, "failure": 0}
    assert south["tool_stats"]["north"] == plain["tool_stats"]["south"] == {"count": 0, "success": 0, "failure": 0}
    # The same keys in every row (the merge fills in a tool only some samples were offered), zeros included.
    assert len({tuple(row["tool_stats"]) for row in rows}) == 1
    assert len({tuple(row["tool_error_counts"]) for row in rows}) == 1
    assert all(row["completed"] for row in rows)
    tools = result.statistics["tool_statistics"]
    assert tools["north"]["count"] == tools["south"]["count"] == 1 and tools["look"]["count"] == 2


def test_a_sample_whose_server_lists_what_cannot_be_offered_fails_before_any_model_call(run_here, server, tmp_path):
    config = stdio_config(tmp_path, "world", script=WORLD, tools=["look"])
    look = call(("look", {"room": "hall"}))
    entries = [
        {"prompt": look + " without look", "files": world(look=False, tools=["north"])},
        {"prompt": look + " too many", "files": world(tools=[f"t{i}" for i in range(300)])},
        {"prompt": look + " honest", "files": world(tools=["north"])},
    ]
    result = run_here(entries, f"--mcp_config={config}", *LOCAL)
    assert result.code == 1, result.stderr
    failed = {line["prompt_index"]: line["message"] for line in result.jsonl("errors.jsonl")}
    assert "MCP server 'world'" in failed[0] and "has no tool 'look' (it lists north)" in failed[0]
    assert "lists 301 tools, more than 256" in failed[1]  # look and 300 more
    assert not any(word in json.dumps(server.chat_requests()) for word in ("without look", "too many"))
    (row,) = result.trajectories  # its allowlist keeps look alone of what it lists
    assert "north" not in offered(row) and '"result": "you are in the hall"' in tool_results(row)


# -- a hostile streamable-HTTP server ---------------------------------------------------------------------

FLOOD = Path(__file__).parent / "mcp_servers" / "flood_server.py"


@contextlib.contextmanager
def flood_server(folder: Path, *mode: str):
    """flood_server.py serving: its config file, and {flood: bytes the client took} once it is done."""
    sent = folder / "sent.log"
    process = subprocess.Popen([sys.executable, str(FLOOD), str(sent), *mode], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        config = folder / "flood.json"
        url = f"http://127.0.0.1:{int(process.stdout.readline())}/mcp"
        config.write_text(json.dumps({"mcpServers": {"flood": {"url": url}}}))
        taken: dict[str, int] = {}
        yield config, taken
    finally:
        process.kill()
        process.wait(10)
    taken.update((name, int(size)) for name, size in (line.split() for line in sent.read_text().splitlines()))


def test_an_http_server_s_floods_are_tool_errors_within_the_timeout_beside_an_honest_tool(run, server, tmp_path):
    hostile = ["flood", "huge", "silent", "big_event", "bomb"]
    calls = [("echo", {"text": "first"})]
    calls += [each for name in hostile for each in ((name, {}), ("echo", {"text": f"after {name}"}))]
    started = time.monotonic()
    with flood_server(tmp_path) as (config, taken):
        flags = (f"--mcp_config={config}", *LOCAL, "--command_timeout=10", "--max_turns=20")
        result = run([{"prompt": call(*calls)}], *flags)
    assert result.code == 0 and "Traceback" not in result.stderr, result.stderr
    assert time.monotonic() - started < 150  # one call waits out --command_timeout; the others end at their cap
    (row,) = result.trajectories
    results = tool_results(row)
    assert row["tool_stats"]["echo"] == {"count": 6, "success": 6, "failure": 0}, results  # the honest twin, after each
    failed = {"count": 1, "success": 0, "failure": 1}
    assert all(row["tool_stats"][name] == failed for name in hostile), row["tool_stats"]
    assert results.count(f"a reply of more than {4 << 20} bytes") == 2  # flood, huge
    assert "silent of MCP server 'flood'" in results and "did not answer within 10 s (--command_timeout)" in results
    assert "echo: after bomb" in results and row["completed"]
    # The runner stopped reading at its cap: it never held what the server would have sent.
    assert taken["flood"] < 64 << 20 and taken["big_event"] < 64 << 20 and taken["huge"] < 64 << 20, taken


def test_an_http_server_flooding_its_tools_list_stops_the_run_before_any_request(run, server, tmp_path):
    with flood_server(tmp_path, "huge_list") as (config, taken):
        result = run([{"prompt": "hi"}], f"--mcp_config={config}", *LOCAL)
    assert result.code == 2 and "MCP server 'flood'" in result.stderr, result.stderr
    assert f"a reply of more than {4 << 20} bytes" in result.stderr and "Traceback" not in result.stderr
    assert not server.chat_requests()
    assert taken["tools/list"] < 64 << 20


def test_what_a_server_says_of_its_env_s_values_reaches_the_model_and_the_console_masked(run, server, tmp_path):
    """An error the server answers, or the stderr of a server that died, quoting its env's value: the model
    read them unmasked (masked only in the run folder, afterwards), and the start's exit-2 message printed it.
    Now masked (and bounded) where they are made; beside them, an honest call is answered."""
    secret = "kv-secret-value-8642"
    config = stdio_config(tmp_path, env={"KV_TOKEN": secret})
    calls = [("leak_error", {"name": "KV_TOKEN"}), ("get", {"key": "a"}), ("crash_saying", {"name": "KV_TOKEN"})]
    result = run([{"prompt": call(*calls, ("get", {"key": "a"}))}], f"--mcp_config={config}", *LOCAL)
    assert result.code == 0, result.stderr
    (row,) = result.trajectories
    sent = json.dumps(server.chat_requests())
    assert secret not in sent and secret not in result.stdout + result.stderr
    assert "backend said [redacted]" in sent and "fatal: token=[redacted]" in sent  # the server's words, masked
    assert '"result": "no value for a"' in tool_results(row)  # the honest call between them
    assert row["tool_stats"]["leak_error"]["failure"] == 1 and row["tool_stats"]["get"]["failure"] == 1
    broken = tmp_path / "broken.json"
    script = "import os, sys; sys.stderr.write('no database for ' + os.environ['KV_TOKEN']); sys.exit(3)"
    spec = {"command": sys.executable, "args": ["-c", script], "env": {"KV_TOKEN": secret}}
    broken.write_text(json.dumps({"mcpServers": {"kv": spec}}))
    refused = run([{"prompt": "hi"}], f"--mcp_config={broken}", *LOCAL, run_name="broken")
    assert refused.code == 2 and "no database for [redacted]" in refused.stderr and secret not in refused.stderr
