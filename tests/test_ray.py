"""The Ray executor: the same batches and run folder as the process pool, with Ray tasks."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, Result, Runner, Started, source, wait_for
from test_mcp import WORLD, WORLDS, assert_offered_their_own, stdio_config
from test_money import answered_calls, assert_no_step_answered_twice, ledger, paid_calls
from test_sandbox_network import probe_command, probe_here
from test_task_folders import REPLACE_CAT, Builds, copy_examples, samples, steer

from trajforge.environments import EnvironmentSettings, backend_for, netns
from trajforge.mock.server import MockServer

if importlib.util.find_spec("ray") is None:  # not imported: the runs import it, this process never needs it
    pytest.skip("Ray is an optional extra: pip install -e '.[ray]'", allow_module_level=True)
# Starting Ray is most of a run's 20 s; on a machine busy with the rest of the suite it has taken 140 s.
RAY_RUN_TIMEOUT = 200
pytestmark = pytest.mark.timeout(2 * RAY_RUN_TIMEOUT)
# One xdist worker runs the tests that join the module's one cluster, one after another (minutes of a whole
# run); another runs the others (the private instance's) meanwhile. Groups, so both go out at the run's start:
# xdist hands out the scopes with the most tests first, the rest (one test each) in file order. One cluster a
# session: the suite is CPU-bound on two cores, and a second cluster, each running half of these tests beside
# the other, cost more CPU (666 s for the whole suite against 631) for no shorter run (468 s against 451).
ON_THE_CLUSTER = pytest.mark.xdist_group("ray")
WITHOUT_THE_CLUSTER = pytest.mark.xdist_group("ray_without_the_cluster")

# Each worker node of a cluster has one CPU: a run's two tasks one on each node, about 10 s of CPU a run against
# 12.5 with two (bench/ray_cluster.py), and a node lost always takes a running batch with it. (Its test once
# found a step sent three times, answered twice, 0.9 and 1.2 s apart: it let the held requests go as soon as the
# node was removed, while the node's workers, which outlive it for a moment, could still send and be answered;
# it now waits for them to be gone.)
NODE_CPUS = 1
TWO_TRIES = {"RAY_gcs_server_port_wait_time_s": "2"}  # a client's tries at the GCS, 1 s apart (ray/_private/node.py)
TOOLS = ["--distribution=terminal_only", "--seed=3", "--num_workers=2", "--concurrency=2"]


def comparable(result) -> list:
    """What must not depend on the executor: the conversations, outcomes and stats of each prompt."""
    rows = []
    for record in sorted(result.trajectories, key=lambda r: r["prompt_index"]):
        text = [t["value"] for t in record["conversations"]]
        rows.append(
            (record["prompt_index"], len(text), record["completed"], record["toolsets_used"], record["tool_stats"])
        )
    return rows


RAY_PROCESSES = ("gcs_server", "raylet", "ray::", "default_worker.py", "runtime_env")
BATCH, SINK, MONEY = "ray::run_batch", "ray::Sink", "ray::MoneyActor"


def descendants(root: int, *names: str) -> list[psutil.Process]:
    """The processes below `root` with one of `names` in their command line: a runner's private Ray instance,
    or the cluster's (its nodes are this process's children), never another session's Ray."""
    found = []
    for process in psutil.Process(root).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that has just exited
            if any(name in " ".join(process.cmdline()) for name in names):
                found.append(process)
    return found


def on_the_cluster(*names: str) -> list[psutil.Process]:
    return descendants(os.getpid(), *names)


def gone(process: psutil.Process) -> bool:
    """Exited (a zombie at most): its connections are closed."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def over(process: psutil.Process) -> bool:
    """Done with its run: exited, or back to idle. Not a process on its way out, whose command line already
    reads empty while its last request may still reach the server."""
    try:
        line = " ".join(process.cmdline())
    except psutil.NoSuchProcess:  # a zombie's too
        return True
    return gone(process) or (bool(line) and not any(name in line for name in (BATCH, SINK, MONEY)))


def node_processes(node) -> list[psutil.Process]:
    """A cluster node's raylet and everything below it (its workers)."""
    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    return [raylet, *raylet.children(recursive=True)]


def job_ended(job: Sequence[psutil.Process] = ()) -> bool:
    """No batch, sink or money actor of a run is left on the cluster, and those of `job` are over."""
    return not on_the_cluster(BATCH, SINK, MONEY) and all(over(process) for process in job)


@WITHOUT_THE_CLUSTER
def test_ray_executor_without_ray_says_how_to_install(run, server, tmp_path):
    command = run.command([{"prompt": "x"}], "--executor=ray")
    hide_ray = (
        f"import runpy, sys; sys.modules['ray'] = None; "
        f"sys.argv = {command[1:]!r}; runpy.run_path({str(ROOT / 'batch_runner.py')!r}, run_name='__main__')"
    )
    proc = subprocess.run([command[0], "-c", hide_ray], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "pip install -e '.[ray]'" in proc.stderr, proc.stderr
    assert server.requests == []


def listening(processes: list[psutil.Process]) -> dict[int, str]:
    """Port -> address of every TCP socket these processes listen on."""
    found = {}
    for process in processes:
        with contextlib.suppress(psutil.Error):
            for sock in process.net_connections(kind="tcp"):
                if sock.status == psutil.CONN_LISTEN:
                    found[sock.laddr.port] = sock.laddr.ip
    return found


@WITHOUT_THE_CLUSTER
def test_the_private_instance_listens_on_the_loopback_only_and_refuses_a_client_without_its_token(run, server):
    """The private instance's GCS, raylets, object manager and agents listen on 127.0.0.1 only, and its
    GCS refuses a client that has not the run's token (the run itself, which has it, finishes and leaves
    none of its instance's processes behind). The one test of a private instance: the others join the
    module's cluster (a Ray start each costs 20-50 s here)."""
    server.hold()
    command = run.command([{"prompt": "task held"}], *TOOLS, "--executor=ray", run_name="private", batch_size=1)
    proc = subprocess.Popen(command, cwd=run.tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    processes: list[psutil.Process] = []
    try:
        wait_for(lambda: descendants(proc.pid, BATCH), RAY_RUN_TIMEOUT, "the run's batch to start on Ray")
        processes = descendants(proc.pid, *RAY_PROCESSES)
        ports = listening(processes)
        gcs = next(p for p in processes if "gcs_server" in " ".join(p.cmdline()))
        assert listening([gcs]) and len(ports) >= 4, ports  # the GCS, the raylet's two servers, the workers'
        assert set(ports.values()) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, ports
        secret = Path(gcs.environ()["RAY_AUTH_TOKEN_PATH"]).read_text()
        assert all(secret not in " ".join(p.environ().values()) for p in processes)  # in a 0600 file only
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        join = f"import ray; ray.init(address='127.0.0.1:{min(listening([gcs]))}'); print('joined')"
        client = subprocess.run(
            [sys.executable, "-c", join],
            # 127.0.0.1 as is; two tries to connect, not Ray's 20 (20 s): each is refused alike
            env={**env, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **TWO_TRIES},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "joined" not in client.stdout and "InvalidAuthToken" in client.stderr, client.stderr[-2000:]
        # Nor can a sandbox with --sandbox_network reach any of its ports, at the loopback or any address
        # of this machine; from here (no sandbox) they answer.
        addresses = ["127.0.0.1", *(a.split("/")[0] for a in netns.host_addresses())]
        targets = [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for port in ports for a in addresses]
        assert set(probe_here([f"127.0.0.1:{port}" for port in ports]).values()) == {"open"}
        sandboxed = asyncio.run(sandboxed_probe(run.tmp_path, targets))
        assert set(json.loads(sandboxed).values()) == {"closed"}, sandboxed
    finally:
        server.release()
        output, _ = proc.communicate(timeout=RAY_RUN_TIMEOUT)
    assert proc.returncode == 0, output
    # ray.shutdown() ends them; they exit slowly on a busy machine
    wait_for(lambda: all(gone(p) for p in processes), 180, "the private instance's processes to exit")


async def sandboxed_probe(folder: Path, targets: list[str]) -> str:
    settings = EnvironmentSettings(kind="bwrap", run_dir=str(folder), command_timeout=120, sandbox_network=True)
    env = await backend_for(settings).open({})
    try:
        return (await env.exec(probe_command(dict(enumerate(targets))))).output
    finally:
        await env.close()


@pytest.fixture(scope="module")
def cluster(request):
    """A Ray cluster of three nodes on this machine (a head without CPUs, where the drivers attach, and two
    worker nodes of NODE_CPUS each), which every run of this module but the private instance's joins with
    --ray_address. Its nodes are this process's children, so a test finds their processes (descendants) apart
    from any other Ray on the machine.
    Its nodes' tasks reach the session's Docker engine when there is one: a node's DOCKER_HOST is the one it
    was started with."""
    from ray.cluster_utils import Cluster

    with contextlib.suppress(pytest.skip.Exception):  # no engine here: the tests that need one skip
        request.getfixturevalue("docker_host")

    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")  # the runs inherit them
    # A killed node's raylet refuses the GCS's health checks at once: it is found dead after five checks in a
    # row, 5 s apart at 1 s a check (Ray's default: 3 s, 15 s in all). A busy node is not: each check still
    # waits Ray's default timeout (10 s) for an answer (a 0.5 s timeout declared busy nodes dead).
    checks = {"health_check_period_ms": 1000}
    # Nor does its head start the autoscaler's monitor (a cluster of fixed nodes) or the log monitor, which read
    # every Ray worker's log as it grew for drivers that never ask for them (every run has log_to_driver=False):
    # a cluster and three runs on it cost 26.6 and 31.0 s of CPU without them, 33.9 and 37.4 s with them
    # (bench/ray_cluster.py).
    head = {"num_cpus": 0, "include_dashboard": False, "_system_config": checks}
    head |= {"no_monitor": True, "include_log_monitor": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=NODE_CPUS)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


ENTRIES = [{"prompt": f"task {i}"} for i in range(8)] + [{"prompt": "silent [mock reasoning=none]"}]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """The process pool's run of ENTRIES, made once: what every Ray run of them must match. Started here and
    read by the first test that compares (the tests ask for it before the cluster, which starts meanwhile)."""
    server = MockServer()
    server.base_url = server.start()
    started = Runner(tmp_path_factory.mktemp("pool"), server).start(ENTRIES, *TOOLS, run_name="pool", batch_size=3)
    try:
        yield started
    finally:
        started.kill()
        server.stop()


def assert_same_as_the_pool(ray: Result, started: Started) -> None:
    pool = started.result()
    assert pool.code == 0 and ray.code == 0, ray.stdout + ray.stderr
    assert comparable(ray) == comparable(pool)
    assert len(ray.trajectories) == 8 and ray.statistics["discarded_no_reasoning"] == 1
    assert Counter(source(r)["prompt"] for r in ray.batch_lines) == Counter(e["prompt"] for e in ENTRIES)  # once each
    assert sorted(p.name for p in ray.run_dir.glob("batch_*.jsonl")) == [
        "batch_0.jsonl",
        "batch_1.jsonl",
        "batch_2.jsonl",
    ]
    wait_for(job_ended, 60, "the cluster to end the run's tasks and actors")  # the run left the cluster as it was


@ON_THE_CLUSTER
def test_ray_gives_the_same_trajectories_as_the_pool(run, pool, cluster):
    """Without a shared file system the lines travel to the driver with the events."""
    flags = [*TOOLS, "--executor=ray", f"--ray_address={cluster.address}"]
    ray = run(ENTRIES, *flags, run_name="ray", batch_size=3, timeout=RAY_RUN_TIMEOUT)
    assert_same_as_the_pool(ray, pool)


@ON_THE_CLUSTER
def test_a_killed_ray_worker_is_retried_and_the_run_is_the_pool_s_without_duplicates(run, server, pool, cluster):
    """With --ray_shared_fs the tasks append to the run folder themselves; one killed mid-batch is run
    again, which keeps the lines it wrote and does the rest."""
    server.latency = 0.3  # batches that last long enough to be caught running
    flags = [*TOOLS, "--executor=ray", f"--ray_address={cluster.address}", "--ray_shared_fs"]
    command = run.command(ENTRIES, *flags, run_name="ray", batch_size=3)
    proc = subprocess.Popen(command, cwd=run.tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    folder = run.tmp_path / "out" / "ray"
    deadline = time.monotonic() + RAY_RUN_TIMEOUT
    killed = None
    while killed is None and time.monotonic() < deadline:
        lines = sum(p.read_bytes().count(b"\n") for p in folder.glob("batch_*.jsonl")) if folder.exists() else 0
        workers = on_the_cluster(BATCH) if lines >= 2 else []  # a scan of the processes only when it can tell
        if workers:
            killed = workers[0].pid
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    output, _ = proc.communicate(timeout=RAY_RUN_TIMEOUT)
    assert killed, "no Ray worker was found to kill"
    assert_same_as_the_pool(Result(proc.returncode, output, "", folder), pool)


@ON_THE_CLUSTER
def test_a_killed_sink_fails_at_most_its_batches_never_the_run(run, server, cluster):
    """The actor that carries the tasks' events is SIGKILLed mid-run: Ray starts it again, the driver
    goes on; each prompt ends once, as a trajectory or (its events lost with the actor) a failure."""
    server.latency = 0.3
    entries = [{"prompt": f"sink {i}"} for i in range(6)]
    flags = [*TOOLS, "--executor=ray", f"--ray_address={cluster.address}"]
    command = run.command(entries, *flags, run_name="sink", batch_size=2)
    proc = subprocess.Popen(command, cwd=run.tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    folder = run.tmp_path / "out" / "sink"
    killed = None
    try:
        deadline = time.monotonic() + RAY_RUN_TIMEOUT
        while killed is None and time.monotonic() < deadline:
            lines = sum(p.read_bytes().count(b"\n") for p in folder.glob("batch_*.jsonl")) if folder.exists() else 0
            sinks = on_the_cluster(SINK) if lines >= 1 else []  # a scan of the processes only when it can tell
            if sinks and on_the_cluster(BATCH):
                killed = sinks[0].pid
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
    finally:
        output, _ = proc.communicate(timeout=RAY_RUN_TIMEOUT)
    assert killed, "no sink actor was found to kill"
    result = Result(proc.returncode, output, "", folder)
    assert result.code in (0, 1), output  # 1: samples whose events were lost, for a resume
    ended = Counter(source(r)["prompt"] for r in result.batch_lines)
    assert max(ended.values()) == 1, ended
    assert result.statistics["trajectories"] + result.statistics["failed"] == len(entries), result.statistics
    wait_for(job_ended, 60, "the cluster to end the run's tasks and actors")


@ON_THE_CLUSTER
def test_on_a_cluster_the_budget_holds_and_a_kill_9_of_the_driver_pays_for_nothing_twice(run, server, cluster):
    """One ledger and cache for the run, in the driver's run folder, reached by every node through the money
    actor: the cluster stops at the budget (exit 3); a resume with more is killed -9 mid-run; the next
    resume finishes; the server answered no conversation step twice."""
    server.cost, server.latency = 0.01, 0.05
    entries = [{"prompt": f"cluster budget {i}"} for i in range(8)]  # 24 calls at $0.01
    flags = [*TOOLS, "--environment=local", "--executor=ray", f"--ray_address={cluster.address}"]
    first = run(entries, *flags, "--max_cost=0.08", batch_size=2, timeout=RAY_RUN_TIMEOUT)
    assert first.code == 3, first.stdout + first.stderr
    in_flight, spent = 2 * 2, first.statistics["budget"]["spent"]
    assert spent == pytest.approx(0.01 * len(server.chat_requests())) and 0.08 - 0.01 < spent <= 0.08 + in_flight * 0.01
    assert first.statistics["budget"]["stopped"] and first.statistics["remaining"] > 0
    assert_no_step_answered_twice(server)

    command = run.command(entries, *flags, "--resume", "--max_cost=1", batch_size=2)
    proc = subprocess.Popen(
        command, cwd=run.tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    answered = answered_calls(server)
    wait_for(lambda: answered_calls(server) >= answered + 4, RAY_RUN_TIMEOUT, "the resume's first answered calls")
    server.hold()  # what is in flight now stays unanswered: every answered call is one the run received
    wait_for(lambda: paid_calls(first.run_dir) == answered_calls(server), 30, "the answers to be stored")
    job = on_the_cluster(BATCH, MONEY)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # Its tasks go on for a moment, and send requests (held: they never reach the ledger) until the cluster
    # ends them; those sent last die with them too, also one still in the server's latency at the release.
    wait_for(lambda: job_ended(job), 60, "the cluster to end the killed driver's tasks and actor")
    server.release(answer=False)

    last = run(entries, *flags, "--resume", "--max_cost=1", batch_size=2, timeout=RAY_RUN_TIMEOUT)
    assert last.code == 0 and len(last.trajectories) == 8, last.stdout + last.stderr
    assert_no_step_answered_twice(server)
    assert answered_calls(server) == len(ledger(last.run_dir)) == 8 * 3
    assert last.statistics["budget"]["spent"] == pytest.approx(sum(ledger(last.run_dir)))


@ON_THE_CLUSTER
def test_a_worker_node_lost_mid_run_loses_no_paid_reply(run, server, cluster):
    """A node dies with batches running on it: Ray runs them again on the node left, their paid calls come
    back from the run's cache (the money actor is on the driver's node), and the run finishes with no
    conversation step answered twice."""
    server.cost, server.latency = 0.01, 0.05
    entries = [{"prompt": f"node loss {i}"} for i in range(8)]
    flags = [*TOOLS, "--environment=local", "--executor=ray", f"--ray_address={cluster.address}", "--max_cost=5"]
    command = run.command(entries, *flags, batch_size=2)
    proc = subprocess.Popen(command, cwd=run.tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: answered_calls(server) >= 4, RAY_RUN_TIMEOUT, "the run's first answered calls")
        server.hold()  # nothing answered from here until the node is gone: every answered call is paid
        run_dir = run.tmp_path / "out" / "run"
        wait_for(lambda: paid_calls(run_dir) == answered_calls(server), 30, "the answers to be stored")
        paid_before = paid_calls(run_dir)
        lost = next(iter(cluster.worker_nodes))
        processes = node_processes(lost)
        cluster.remove_node(lost, allow_graceful=False)
        # Its workers outlive its raylet until they notice (Ray looks once a second; longer on a busy machine),
        # sending what they please meanwhile: a reply answered then may never reach the ledger, and is paid
        # again (docs/ray.md). Released once they are gone, every answer is one a live worker received.
        wait_for(lambda: all(gone(p) for p in processes), 60, "the lost node's workers to exit")
        server.release(answer=False)  # what was in flight on either node is dropped: sent again, never paid twice
        output, _ = proc.communicate(timeout=RAY_RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.add_node(num_cpus=NODE_CPUS)  # the cluster as the other tests of this module found it
        cluster.wait_for_nodes()
    assert proc.returncode == 0, output
    result = Result(0, output, "", run.tmp_path / "out" / "run")
    assert len(result.trajectories) == 8
    assert_no_step_answered_twice(server)  # what was paid before the loss came back from the cache
    # A sample the lost node had begun runs again from its cached calls; one whose workspace the killed
    # attempt changed (a file it wrote) may need a new call for its next step, paid like any other: every
    # answer reached the ledger.
    paid = len(ledger(result.run_dir))
    assert paid_before <= paid and 8 * 3 <= paid == answered_calls(server)


@ON_THE_CLUSTER
def test_a_plugin_file_reaches_the_cluster_s_workers_with_the_run(run, server, cluster, tmp_path):
    """Its text travels in the run's settings: each Ray task loads it (docs/ray.md), the file need not be on
    the workers' nodes; its tool runs there and is counted like a built-in one."""
    plugin = tmp_path / "greeter.py"
    plugin.write_text(
        "import os\n\n\nasync def greet(session, name: str) -> dict:\n"
        '    """Greet someone.\n\n    Args:\n        name: who\n    """\n'
        '    return {"greeting": f"hello {name}", "pid": os.getpid()}\n\n\n'
        "def register(registry):\n"
        '    registry.toolset("greeter", [greet])\n'
        '    registry.distribution("greeting", {"greeter": 100})\n'
    )
    entries = [{"prompt": f"[mock call=greet:%7B%22name%22%3A%22n{i}%22%7D] greet {i}"} for i in range(4)]
    flags = [f"--plugins={plugin}", "--distribution=greeting", "--environment=local", "--executor=ray"]
    result = run(entries, *flags, f"--ray_address={cluster.address}", batch_size=2, timeout=RAY_RUN_TIMEOUT)
    assert result.code == 0, result.stdout + result.stderr
    assert len(result.trajectories) == 4
    for row in result.trajectories:
        assert row["tool_stats"]["greet"] == {"count": 1, "success": 1, "failure": 0}
        assert "hello n" in row["conversations"][3]["value"]


def rewards(run_dir: Path) -> dict:
    """(task, sample index) -> (passed, reward) of each sample of a run over task folders."""
    return {
        (name, record["metadata"]["sample_index"]): (
            record["metadata"]["verification"]["passed"],
            record["metadata"]["verification"]["reward"],
        )
        for name, records in samples(run_dir).items()
        for record in records
    }


@ON_THE_CLUSTER
def test_task_folders_on_a_cluster_are_the_pool_s_built_once_and_resumed_without_building(
    docker_host, run, server, cluster, tmp_path
):
    """Harbor task folders on the cluster: each image is built once by the driver before any batch is handed
    out (--n_samples=2), the tasks on the worker nodes verify each sample in a fresh container (an agent that
    replaced /bin/cat gains nothing there), every reward is the process pool's, and a resume builds nothing
    and sends nothing."""
    tasks = copy_examples(tmp_path, unique=True)
    shutil.copytree(tasks / "hello-file", tasks / "hello-cat")
    steer(tasks / "hello-file", "echo 'Hello, world!' > hello.txt")
    steer(tasks / "hello-cat", REPLACE_CAT)
    flags = ["--n_samples=2", "--distribution=terminal_only", "--seed=3", "--environment=docker"]
    on_ray = [*flags, "--executor=ray", f"--ray_address={cluster.address}", "--num_workers=2"]
    builds = Builds(tasks)
    ray = run(tasks, *on_ray, run_name="ray", batch_size=2, timeout=RAY_RUN_TIMEOUT)
    assert ray.code == 0, ray.stdout + ray.stderr
    assert builds.count() == 4  # one per task, by the driver, for both samples and both worker nodes

    # The pool's run goes on beside the resume, with a server of its own: the resume must send nothing.
    sent, builds = len(server.chat_requests()), Builds(tasks)
    found = rewards(ray.run_dir)
    pool_server = MockServer()
    pool_server.base_url = pool_server.start()
    started = Runner(tmp_path, pool_server).start(tasks, *flags, run_name="pool", batch_size=2)
    try:
        again = run(tasks, *on_ray, "--resume", run_name="ray", batch_size=2, timeout=RAY_RUN_TIMEOUT)
        pool = started.result(RAY_RUN_TIMEOUT)
    finally:
        started.kill()
        pool_server.stop()
    assert again.code == 0, again.stdout + again.stderr
    assert len(server.chat_requests()) == sent and builds.count() == 0  # nor did the pool build
    assert pool.code == 0, pool.stdout + pool.stderr

    assert found == rewards(pool.run_dir)
    assert {key: value for key, value in found.items() if value[0]} == {
        ("hello-file", 0): (True, 1.0),
        ("hello-file", 1): (True, 1.0),
    }
    assert len(found) == 8 and found["hello-cat", 0] == (False, 0.0)


@ON_THE_CLUSTER
def test_ray_workers_offer_each_sample_the_tools_its_server_lists_for_it(run, server, cluster, tmp_path):
    """An MCP server's tools as it lists them for each sample (test_mcp.py's WORLDS), offered by Ray tasks."""
    config = stdio_config(tmp_path, "world", script=WORLD)
    flags = ["--distribution=terminal_only", "--environment=local", "--executor=ray", "--num_workers=2"]
    result = run(WORLDS, f"--mcp_config={config}", *flags, f"--ray_address={cluster.address}", timeout=RAY_RUN_TIMEOUT)
    assert_offered_their_own(result, server)
