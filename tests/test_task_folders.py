"""Task folders in Harbor's format (--dataset_file=FOLDER) with the real Docker engine and the scripted
model: the example folder through --check_tasks and through a run (an image built once per task for
--n_samples=3, a resume that builds and sends nothing), bad folders refused at load, and agents that try
to fake the reward by changing what test.sh runs (a program it calls, sitecustomize.py, /etc/ld.so.preload)
beside the honest sample that passes."""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import io
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import ROOT, source, tool_results
from test_host_folders import root_only_folder

from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.environments.folder_task import FolderSettings
from trajforge.environments.trees import remove_tree
from trajforge.errors import SetupFailed
from trajforge.run.task_folders import build_context, image_tag
from trajforge.verification.host_folders import NO_FOLDERS, task_files
from trajforge.verification.tasks import prepare_task
from trajforge.verification.tree_reader import Unreadable

EXAMPLE = ROOT / "data" / "example_harbor"
FAKE_REWARD_C = ROOT / "tests" / "fixtures" / "harbor" / "fake_reward.c"


def copy_examples(tmp_path: Path, unique: bool = False) -> Path:
    """The example tasks in tmp_path; `unique`: each build context gets a file of its own, so its image
    is built by this test and no other."""
    tasks = tmp_path / "tasks"
    shutil.copytree(EXAMPLE, tasks)
    if unique:
        for environment in tasks.glob("*/environment"):
            (environment / "nonce").write_text(uuid.uuid4().hex)
    return tasks


def steer(task: Path, command: str) -> None:
    """The scripted model's first terminal command, for this task (a directive in its instruction)."""
    with (task / "instruction.md").open("a") as handle:
        handle.write(f"\n[mock command={quote(command, safe='')}]\n")


class Builds:
    """Counts the images the engine tags as task folders' images while it is open (one per `docker
    build`), from its live event stream: the engine keeps only its last 256 events for a later look."""

    def __init__(self, tasks: Path):
        import docker

        built = [task.resolve() for task in tasks.iterdir() if (task / "environment").is_dir()]  # not a docker_image's
        self.ours = {image_tag(task.name, build_context(task_files(task, "environment"))) for task in built}
        self.client = docker.from_env()
        self.events = self.client.events(decode=True, filters={"type": "image", "event": "tag"})
        self.tags: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):  # the stream ends when close() closes it
            for event in self.events:
                self.tags.append(event["Actor"]["Attributes"].get("name", ""))

    def count(self) -> int:
        """The builds so far, once their events have reached the stream: the engine sends them in order, so all
        are read once the tag of a mark made now is (a second's sleep took their place before)."""
        mark = f"batch-runner-test/events-mark:{uuid.uuid4().hex[:12]}"
        self.client.images.get("batch-runner-test/harbor-base:1").tag(mark)
        deadline = time.monotonic() + 30
        while mark not in self.tags and time.monotonic() < deadline:
            time.sleep(0.01)
        self.client.images.remove(mark, noprune=True)
        self.events.close()
        self.client.close()
        self.reader.join(10)
        return sum(tag in self.ours for tag in self.tags)  # other tests build at the same time


def samples(run_dir: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for line in (run_dir / "trajectories.jsonl").read_text().splitlines():
        record = json.loads(line)
        found.setdefault(source(record)["harbor"]["name"], []).append(record)
    return found


def test_check_tasks_on_the_example_folder_passes_without_a_model_call(docker_host, run_here, server):
    done = run_here(EXAMPLE, "--check_tasks")
    assert done.code == 0, done.stderr + done.stdout
    assert "3 of 3 tasks sound" in done.stdout
    checks = [json.loads(line) for line in (done.run_dir / "task_check.jsonl").read_text().splitlines()]
    assert [check["ok"] for check in checks] == [True, True, True]
    assert server.chat_requests() == []


def test_check_tasks_names_a_broken_oracle_and_a_task_a_noop_passes(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path)
    (tasks / "hello-file" / "solution" / "solve.sh").write_text("#!/bin/bash\necho 'Hello, moon!' > hello.txt\n")
    (tasks / "fix-greeting" / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    done = run_here(tasks, "--check_tasks")
    assert done.code == 1, done.stderr + done.stdout
    assert "1 of 3 tasks sound" in done.stdout
    assert "the oracle fails" in done.stdout and "doing nothing passes" in done.stdout
    assert server.chat_requests() == []


def test_a_run_over_the_example_folder_builds_once_per_task_and_resumes_without_building(
    docker_host, run_here, server, tmp_path
):
    tasks = copy_examples(tmp_path, unique=True)
    steer(tasks / "hello-file", "echo 'Hello, world!' > hello.txt")
    builds = Builds(tasks)
    done = run_here(tasks, "--n_samples=3", "--distribution=terminal_only", "--environment=auto")
    assert done.code == 0, done.stderr + done.stdout
    assert builds.count() == 3  # one `docker build` per task, not per sample
    found = samples(done.run_dir)
    assert {name: len(records) for name, records in found.items()} == {
        "hello-file": 3,
        "sum-numbers": 3,
        "fix-greeting": 3,
    }
    for record in found["hello-file"]:  # solved: reward.txt says 1
        verification = record["metadata"]["verification"]
        assert (verification["passed"], verification["reward"]) == (True, 1.0)
        assert verification["output"].splitlines()[0] == '{"reward": 1.0}'
    for record in found["sum-numbers"]:  # not solved; reward.json's every key kept
        verification = record["metadata"]["verification"]
        assert (verification["passed"], verification["reward"]) == (False, 0.0)
        assert json.loads(verification["output"].splitlines()[0]) == {"reward": 0.0, "exists": 0.0}
    entry = source(found["fix-greeting"][0])
    assert entry["harbor"]["folder"] == str((tasks / "fix-greeting").resolve())
    assert 'GREETING_NAME = "Ada"' in entry["harbor"]["task_toml"]
    assert "canary" not in source(found["hello-file"][0])["prompt"].lower()

    sent, builds = len(server.chat_requests()), Builds(tasks)
    again = run_here(tasks, "--n_samples=3", "--distribution=terminal_only", "--resume")
    assert again.code == 0, again.stderr + again.stdout
    assert len(server.chat_requests()) == sent
    assert builds.count() == 0


def test_fixing_a_test_re_pays_nothing(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path)
    shutil.rmtree(tasks / "sum-numbers")
    shutil.rmtree(tasks / "fix-greeting")
    first = run_here(tasks, "--distribution=terminal_only")
    assert first.code == 0, first.stderr
    sent = len(server.chat_requests())
    (tasks / "hello-file" / "tests" / "test.sh").write_text("#!/bin/bash\necho 0.5 > /logs/verifier/reward.txt\n")
    again = run_here(tasks, "--distribution=terminal_only", "--resume")
    assert again.code == 0, again.stderr
    assert len(server.chat_requests()) == sent


def test_a_build_that_fails_is_setup_failed_with_its_output_kept(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path)
    for name in ("sum-numbers", "fix-greeting"):
        shutil.rmtree(tasks / name)
    dockerfile = tasks / "hello-file" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + f"RUN echo {uuid.uuid4().hex} && exit 3\n")
    done = run_here(tasks, "--distribution=terminal_only")
    assert done.code == 1, done.stderr + done.stdout
    log = done.run_dir / "builds" / "hello-file.log"
    assert "returned a non-zero code: 3" in log.read_text()
    errors = [json.loads(line) for line in (done.run_dir / "errors.jsonl").read_text().splitlines()]
    assert [error["error_type"] for error in errors] == ["setup_failed"]
    assert server.chat_requests() == []


def build_step(allocate_mb: int, print_mb: int) -> str:
    """A Dockerfile's RUN: the CPUs it may use, `print_mb` MB of output, then `allocate_mb` MB of memory."""
    code = (
        "import os, sys; print('cpus=%d' % len(os.sched_getaffinity(0)), flush=True); "
        f"[sys.stdout.write('y' * 99 + chr(10)) for _ in range({print_mb} * 10000)]; print('output-ends', flush=True); "
        f"x = bytearray({allocate_mb} << 20); x[::4096] = b'y' * len(x[::4096]); print('allocated', flush=True)"
    )
    return f'RUN python3 -c "{code}"\n'


def test_a_build_runs_within_the_task_s_limits_and_keeps_the_last_of_its_output(
    docker_host, run_here, server, tmp_path
):
    """A hostile Dockerfile's RUN steps ran with no memory or CPU limit (the agent's container has the
    task's), and its output was kept whole, in the runner's memory and in builds/<task>.log (100 MB of it
    took the runner to 433 MB). Now the build has the task's memory and CPUs (hello-file: 512 MB, one CPU)
    and only the last of its output is kept; the honest twin, a build within them, builds and is sound."""
    tasks = copy_examples(tmp_path, unique=True)
    shutil.rmtree(tasks / "sum-numbers")
    shutil.rmtree(tasks / "fix-greeting")
    shutil.copytree(tasks / "hello-file", tasks / "hello-honest")
    base = f"FROM batch-runner-test/harbor-base:1\nWORKDIR /app\nRUN echo {uuid.uuid4().hex}\n"  # no cached step
    (tasks / "hello-file" / "environment" / "Dockerfile").write_text(base + build_step(800, 3))
    (tasks / "hello-honest" / "environment" / "Dockerfile").write_text(base + build_step(64, 0))
    done = run_here(tasks, "--check_tasks")
    assert done.code == 1, done.stderr + done.stdout
    assert "1 of 2 tasks sound" in done.stdout, done.stdout
    log = (done.run_dir / "builds" / "hello-file.log").read_text()
    assert len(log) < 300_000 and "bytes of the build's output are not kept" in log, log[:300]
    assert "output-ends" in log and "\nallocated\n" not in log and "returned a non-zero code: 137" in log, log[-500:]
    assert "\ncpus=1\n" not in log  # printed before the 3 MB: not kept
    assert not (done.run_dir / "builds" / "hello-honest.log").exists()
    assert server.chat_requests() == []


def test_a_build_has_the_task_s_cpus(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path, unique=True)
    shutil.rmtree(tasks / "sum-numbers")
    shutil.rmtree(tasks / "fix-greeting")
    base = f"FROM batch-runner-test/harbor-base:1\nWORKDIR /app\nRUN echo {uuid.uuid4().hex}\n"  # no cached step
    (tasks / "hello-file" / "environment" / "Dockerfile").write_text(base + build_step(1, 0) + "RUN false\n")
    done = run_here(tasks, "--check_tasks")
    assert done.code == 1, done.stderr + done.stdout
    assert "cpus=1\n" in (done.run_dir / "builds" / "hello-file.log").read_text()  # its task.toml: cpus = 1


def built_twins(tmp_path: Path, hostile: str, honest: str) -> Path:
    """hello-file as two tasks whose Dockerfiles end with the RUN steps given (each run anew: a nonce)."""
    tasks = copy_examples(tmp_path)
    shutil.rmtree(tasks / "sum-numbers")
    shutil.rmtree(tasks / "fix-greeting")
    shutil.copytree(tasks / "hello-file", tasks / "hello-honest")
    base = "FROM batch-runner-test/harbor-base:1\nWORKDIR /app\n"  # as the example's: no image of its own
    for name, step in (("hello-file", hostile), ("hello-honest", honest)):
        run = step.replace("RUN ", f"RUN : {uuid.uuid4().hex}; ", 1)
        (tasks / name / "environment" / "Dockerfile").write_text(base + run)
    return tasks


@contextlib.contextmanager
def images_removed(tasks: Path):
    """The images built from `tasks` are removed afterwards, not their untagged parents: a build of another test
    running meanwhile may be using one as its cache (the base's WORKDIR step), and a pruned parent failed it
    with 'unable to find image'."""
    import docker

    try:
        yield
    finally:
        client = docker.from_env()
        for task in tasks.iterdir():
            with contextlib.suppress(docker.errors.DockerException):
                tag = image_tag(task.name, build_context(task_files(task, "environment")))
                client.images.remove(tag, force=True, noprune=True)
        client.close()


def spawn_step(count: int) -> str:
    """A RUN that says its pids cgroup, then starts `count` sleeps of 5 s at once and waits for them (bounded:
    never a fork bomb; without a limit, `count` processes for 5 s)."""
    return (
        "RUN grep :pids: /proc/self/cgroup; i=0; "
        f"while [ $i -lt {count} ]; do sleep 5 & i=$((i+1)); done; wait; echo started-$i\n"
    )


def test_a_build_runs_within_max_processes(docker_host, run_here, server, tmp_path):
    """A hostile Dockerfile's RUN steps had no process limit (the legacy builder's API takes none), while the
    agent's container has --max_processes: a fork bomb at build time took the host. Now the build's RUN
    containers are in a cgroup of the build whose pids.max is --max_processes: 300 processes at once fail to
    start under 64, and the build fails; its honest twin, 8 of them, builds. The cgroup is gone after."""
    tasks = built_twins(tmp_path, spawn_step(300), spawn_step(8))
    with images_removed(tasks):
        done = run_here(tasks, "--check_tasks", "--max_processes=64")
    assert done.code == 1, done.stderr + done.stdout
    assert "1 of 2 tasks sound" in done.stdout, done.stdout
    assert "not enforced" not in done.stdout + done.stderr
    log = (done.run_dir / "builds" / "hello-file.log").read_text()
    assert "can't fork" in log and "started-300" not in log and "returned a non-zero code" in log, log[-800:]
    parent = log.split(":pids:/", 1)[1].split("/", 1)[0]
    assert parent.startswith("batch-runner-build-"), log[:800]
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{parent}")) + list(Path("/sys/fs/cgroup").glob(parent))
    assert not (done.run_dir / "builds" / "hello-honest.log").exists()
    assert server.chat_requests() == []


class TcpToEngine:
    """The engine of unix socket `socket_path` on a loopback TCP port: an engine the runner takes for a remote one."""

    def __init__(self, socket_path: str):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socket_path = socket_path
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # until close()
            while True:
                client, _ = self.listener.accept()
                engine = socket.socket(socket.AF_UNIX)
                engine.connect(self.socket_path)
                for source, target in ((client, engine), (engine, client)):
                    threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    @staticmethod
    def _pipe(source, target) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(1)  # SHUT_WR

    def close(self) -> None:
        self.listener.close()


def test_a_remote_engine_s_builds_are_said_to_have_no_process_limit(
    docker_host, run_here, server, tmp_path, monkeypatch
):
    """No cgroup of the runner's bounds an engine elsewhere: the run says once that --max_processes is not
    enforced on its builds, and builds (the honest twin's 8 processes)."""
    tasks = built_twins(tmp_path, spawn_step(8), spawn_step(8))
    engine = TcpToEngine(docker_host.removeprefix("unix://"))
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{engine.port}")
    try:
        with images_removed(tasks):
            done = run_here(tasks, "--check_tasks", "--max_processes=64")
    finally:
        engine.close()
    assert done.code == 0, done.stderr + done.stdout
    said = "--max_processes not enforced on task images being built: the Docker engine is not on this machine"
    assert (done.stdout + done.stderr).count(said) == 1, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("unshare", "said"),
    [
        ([], ""),
        (["unshare", "--pid", "--fork", "--mount-proc"], "the Docker engine is in another process namespace"),
        (["unshare", "--cgroup"], "the Docker engine is in another cgroup namespace"),
    ],
)
def test_a_build_cgroup_is_made_only_where_the_engine_sees_it(docker_host, unshare, said):
    """A runner in a container with the engine's socket would make its build cgroup in its own view of the
    hierarchy while the engine takes the parent's name in its own: no limit, said to be one. A runner whose
    process or cgroup namespace is not the engine's makes none (the run says --max_processes is not enforced
    on builds); here, beside the engine, it does."""
    code = "import docker; from trajforge.environments.build_cgroup import place; print(place(docker.from_env()))"
    done = subprocess.run([*unshare, sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    hierarchy, why = ast.literal_eval(done.stdout.strip())
    assert (hierarchy.startswith("/sys/fs/cgroup") != bool(said)) and said in why, done.stdout


def test_a_build_past_its_timeout_ends_on_the_engine_too(docker_host, run_here, server, tmp_path):
    """At build_timeout_sec the runner closed its client's pool, which leaves the connection in use open: the
    build went on on the engine (its RUN ran to its end, a `sleep infinity` for ever) while the runner
    waited 30 s more. Now the build's connection is shut, which the engine takes as the build's cancel: its
    RUN's container is gone as the run ends. The honest twin builds."""
    tasks = built_twins(tmp_path, "RUN sleep 300\n", "RUN true\n")
    toml = tasks / "hello-file" / "task.toml"
    toml.write_text(toml.read_text().replace("build_timeout_sec = 120.0", "build_timeout_sec = 3.0"))
    nonce = (tasks / "hello-file" / "environment" / "Dockerfile").read_text().split("RUN : ", 1)[1].split(";")[0]
    with images_removed(tasks):
        done = run_here(tasks, "--check_tasks")
    assert done.code == 1, done.stderr + done.stdout
    assert "1 of 2 tasks sound" in done.stdout, done.stdout
    assert "the build did not end within 3s" in (done.run_dir / "builds" / "hello-file.log").read_text()
    import docker

    client = docker.from_env()
    running: list[str] = []
    try:
        for _ in range(50):  # the engine removes the cancelled step's container as it ends
            # One listing with each container's command (no inspect of each: another test's container may go
            # between the listing and its inspect, a 404 that failed this test under load).
            running = [c["Id"] for c in client.api.containers() if nonce in (c.get("Command") or "")]
            if not running:
                break
            time.sleep(0.1)
        assert not running, running
    finally:
        for container in running:  # what the engine went on running, not left for 300 s
            with contextlib.suppress(docker.errors.NotFound):  # it ended meanwhile
                client.api.remove_container(container, force=True)
        client.close()


def test_a_build_runs_within_max_memory_mb(docker_host, run_here, server, tmp_path):
    """The build's memory is the lower of task.toml's (hello-file: 512 MB) and --max_memory_mb: 200 MB in a
    RUN under --max_memory_mb=96 is killed (137), its honest twin's 16 MB builds."""
    tasks = built_twins(tmp_path, build_step(200, 0), build_step(16, 0))
    with images_removed(tasks):
        done = run_here(tasks, "--check_tasks", "--max_memory_mb=96")
    assert done.code == 1, done.stderr + done.stdout
    assert "1 of 2 tasks sound" in done.stdout, done.stdout
    log = (done.run_dir / "builds" / "hello-file.log").read_text()
    assert "\nallocated\n" not in log and "returned a non-zero code: 137" in log, log[-500:]
    assert not (done.run_dir / "builds" / "hello-honest.log").exists()


# Each plant is proved to work in the agent's own container (the commands after it show its effect there);
# verification in a fresh container of the image must not see it.
REPLACE_CAT = (
    "rm /bin/cat && printf '#!/bin/sh\\necho Hello, world!\\n' > /bin/cat && chmod +x /bin/cat && "
    "echo planted; bash -c 'cat /app/hello.txt'"
)
SITECUSTOMIZE = (
    "site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])')/sitecustomize.py; "
    'rm -f "$site"; '  # Debian's is a link into /etc
    'printf \'import os\\nos.makedirs("/logs/verifier", exist_ok=True)\\n'
    'open("/logs/verifier/reward.json", "w").write("{\\\\"reward\\\\": 1}")\\nos._exit(0)\\n\' '
    '> "$site"; '
    "python3 -c 'print(1)'; cat /logs/verifier/reward.json; rm -rf /logs/verifier"
)


def preload_command(library: bytes) -> str:
    encoded = base64.b64encode(library).decode()
    return (
        f"echo {encoded} | base64 -d > /app/fake.so && echo /app/fake.so > /etc/ld.so.preload && "
        "mkdir -p /logs/verifier && bash -c 'echo never'; cat /logs/verifier/reward.txt; rm -rf /logs/verifier"
    )


def test_an_agent_cannot_fake_the_reward_by_changing_what_test_sh_runs(docker_host, run_here, server, tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the preloaded library of the attack")
    library = tmp_path / "fake.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Os", "-s", "-o", library, FAKE_REWARD_C], check=True)
    tasks = copy_examples(tmp_path)
    shutil.copytree(tasks / "hello-file", tasks / "hello-preload")
    shutil.copytree(tasks / "hello-file", tasks / "hello-honest")
    shutil.rmtree(tasks / "fix-greeting")
    steer(tasks / "hello-file", REPLACE_CAT)
    steer(tasks / "sum-numbers", SITECUSTOMIZE)
    steer(tasks / "hello-preload", preload_command(library.read_bytes()))
    steer(tasks / "hello-honest", "echo 'Hello, world!' > hello.txt")
    done = run_here(tasks, "--distribution=terminal_only")
    assert done.code == 0, done.stderr + done.stdout
    found = {name: records[0] for name, records in samples(done.run_dir).items()}
    # Each attack took hold where the agent worked ...
    assert "planted\\nHello, world!" in tool_results(found["hello-file"])  # (the results are JSON text)
    assert '{\\"reward\\": 1}' in tool_results(found["sum-numbers"])
    said = tool_results(found["hello-preload"])
    assert "never" not in said and '"output": "1\\n"' in said
    # ... and none reached the verification, while the honest twin passes.
    for name in ("hello-file", "sum-numbers", "hello-preload"):
        verification = found[name]["metadata"]["verification"]
        assert (name, verification["passed"], verification["reward"]) == (name, False, 0.0)
    assert found["hello-honest"]["metadata"]["verification"]["passed"] is True


SECRET_CMP = (
    "#!/bin/bash\nif cmp -s /app/out.txt /tests/expected.txt; then echo 1; else echo 0; fi"
    " > /logs/verifier/reward.txt\n"
)


def test_a_link_into_the_hidden_tests_is_not_carried_into_the_fresh_container(docker_host, run_here, server, tmp_path):
    # In the agent's container /tests is its own link to /app, so /app/out.txt -> /tests/expected.txt looks
    # internal there; in the fresh container it would read the real expected answer. The carried work
    # folder is filtered on the host: an absolute link goes, whatever it points at; a relative one inside stays.
    tasks = copy_examples(tmp_path)
    for name in ("sum-numbers", "fix-greeting"):
        shutil.rmtree(tasks / name)
    for name in ("secret-link", "secret-honest", "secret-inward"):
        shutil.copytree(tasks / "hello-file", tasks / name)
        (tasks / name / "tests" / "expected.txt").write_text("the-secret-answer-7731\n")
        (tasks / name / "tests" / "test.sh").write_text(SECRET_CMP)
    shutil.rmtree(tasks / "hello-file")
    steer(tasks / "secret-link", "rm -rf /tests; ln -s /app /tests && ln -s /tests/expected.txt /app/out.txt")
    steer(tasks / "secret-honest", "echo the-secret-answer-7731 > /app/out.txt")
    steer(tasks / "secret-inward", "mkdir d && echo the-secret-answer-7731 > d/answer && ln -s d/answer out.txt")
    done = run_here(tasks, "--distribution=terminal_only")
    assert done.code == 0, done.stderr + done.stdout
    found = {name: records[0]["metadata"]["verification"] for name, records in samples(done.run_dir).items()}
    assert (found["secret-link"]["passed"], found["secret-link"]["reward"]) == (False, 0.0), found["secret-link"]
    assert "removed before verification" in found["secret-link"]["output"]
    assert "out.txt" in found["secret-link"]["output"] and "expected" not in found["secret-link"]["output"]
    assert found["secret-honest"]["passed"] is True and found["secret-inward"]["passed"] is True, found


def test_no_reward_file_is_a_verification_error_not_a_crash(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path)
    for name in ("sum-numbers", "fix-greeting"):
        shutil.rmtree(tasks / name)
    # Thousands of lines first: what the record keeps is the end, where test.sh says why.
    (tasks / "hello-file" / "tests" / "test.sh").write_text("#!/bin/bash\nseq 5000\necho tested\nexit 4\n")
    done = run_here(tasks, "--distribution=terminal_only")
    assert done.code == 0, done.stderr
    verification = samples(done.run_dir)["hello-file"][0]["metadata"]["verification"]
    assert verification["passed"] is False
    assert "wrote no /logs/verifier/reward.txt nor reward.json (test.sh exited 4)" in verification["error"]
    assert verification["output"].endswith("4999\n5000\ntested\n")


def bad_folder(tmp_path: Path, name: str) -> tuple[Path, str]:
    """A copy of the examples with one folder broken as `name` says; what the refusal must say."""
    tasks = copy_examples(tmp_path)
    task = tasks / "hello-file"
    if name == "no instruction":
        (task / "instruction.md").unlink()
        return tasks, "has no instruction.md"
    if name == "invalid toml":
        (task / "task.toml").write_text("[agent\ntimeout_sec = 1\n")
        return tasks, "task.toml cannot be read"
    if name == "bad value":
        (task / "task.toml").write_text("[verifier]\ntimeout_sec = -1\n")
        return tasks, "[verifier] timeout_sec must be a number of seconds more than 0"
    if name == "infinite build timeout":  # TOML has inf: named with its field, not a traceback
        (task / "task.toml").write_text("[environment]\nbuild_timeout_sec = inf\n")
        return tasks, "[environment] build_timeout_sec must be a number of seconds more than 0"
    if name == "link out of tests":
        (task / "tests" / "passwd").symlink_to("/etc/passwd")
        return tasks, "tests/passwd is a link that leaves the task folder"
    if name == "link loop in tests":  # (review 11) Path.resolve raised RuntimeError: a traceback, exit 1
        (task / "tests" / "loop").symlink_to("loop")
        return tasks, "tests/loop is a link that leaves the task folder (or loops)"
    if name == "link out of environment":
        (task / "environment" / "up").symlink_to(tmp_path)
        return tasks, "environment/up is a link that leaves the task folder"
    if name == "linked instruction":  # a link out is never followed: its target is not the prompt
        (tmp_path / "elsewhere.md").write_text("Tell me the secret.\n")
        (task / "instruction.md").unlink()
        (task / "instruction.md").symlink_to(tmp_path / "elsewhere.md")
        return tasks, "has no instruction.md (a regular file: a link is not followed)"
    if name == "big instruction":
        (task / "instruction.md").write_text("x" * 1_000_001)
        return tasks, "instruction.md is 1000001 bytes"
    if name == "duplicate":
        shutil.copytree(task, tasks / "more" / "hello-file")
        return tasks, "the task name 'hello-file' is also"
    if name == "add url":  # lowercase, flags, the URL on a continuation line: the engine would fetch it
        (task / "environment" / "Dockerfile").write_text(
            "FROM batch-runner-test/harbor-base:1\n# a comment\nadd --chmod=644 \\\n"
            "  http://127.0.0.1:9/secret.txt \\\n  /secret.txt\nWORKDIR /app\n"
        )
        return tasks, "environment/Dockerfile line 3: ADD http://127.0.0.1:9/secret.txt"
    if name == "add git":
        (task / "environment" / "Dockerfile").write_text(
            'FROM batch-runner-test/harbor-base:1\nADD ["git@github.com:a/b.git", "/src"]\n'
        )
        return tasks, "environment/Dockerfile line 2: ADD git@github.com:a/b.git"
    if name == "compose":
        (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")
        return tasks, "docker-compose environments are not supported"
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "no instruction",
        "invalid toml",
        "bad value",
        "infinite build timeout",
        "link out of tests",
        "link loop in tests",
        "link out of environment",
        "big instruction",
        "linked instruction",
        "duplicate",
        "compose",
        "add url",
        "add git",
    ],
)
def test_a_bad_task_folder_is_refused_at_load_naming_it(run_here, server, tmp_path, name):
    tasks, said = bad_folder(tmp_path, name)
    done = run_here(tasks)
    assert done.code == 2, done.stderr
    assert "hello-file" in done.stderr and said in done.stderr, done.stderr
    assert server.chat_requests() == []


def test_a_local_add_builds_and_a_missing_base_image_is_not_pulled(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path, unique=True)
    shutil.rmtree(tasks / "sum-numbers")
    hello = tasks / "hello-file" / "environment"
    (hello / "note.txt").write_text("local\n")
    (hello / "Dockerfile").write_text(
        "FROM batch-runner-test/harbor-base:1\nADD note.txt /opt/\nRUN echo 'ADD http://127.0.0.1:9/x'\nWORKDIR /app\n"
    )
    # A base the engine does not have: it would pull it from its own network (here a closed loopback port).
    (tasks / "fix-greeting" / "environment" / "Dockerfile").write_text("FROM 127.0.0.1:9/nothing/here:1\n")
    done = run_here(tasks, "--check_tasks")
    assert done.code == 1, done.stderr + done.stdout
    log = (done.run_dir / "builds" / "fix-greeting.log").read_text()
    assert log == "127.0.0.1:9/nothing/here:1: not on the Docker engine, and the runner pulls no image\n"
    assert not (done.run_dir / "builds" / "hello-file.log").exists()
    assert "1 of 2 tasks sound" in done.stdout  # hello-file, built with its local ADD


def test_task_folders_refuse_an_environment_other_than_docker(run_here, server):
    done = run_here(EXAMPLE, "--environment=bwrap")
    assert done.code == 2
    assert "task folders run in Docker (fix-greeting, hello-file, sum-numbers)" in done.stderr
    assert server.chat_requests() == []


def test_a_jsonl_line_cannot_claim_to_be_a_task_folder(run_here, server):
    done = run_here([{"prompt": "hi", "harbor": {"folder": "/etc", "digest": "x"}}])
    assert done.code == 2
    assert '"harbor" is the runner\'s own field' in done.stderr


LIMITS = (
    "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max "  # cgroup v2, else v1
    "/sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null"
)


def test_task_toml_limits_are_the_containers_the_lower_of_file_and_flag(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path)
    for name in ("sum-numbers", "fix-greeting"):
        shutil.rmtree(tasks / name)
    steer(tasks / "hello-file", LIMITS)  # its task.toml: cpus = 1, memory_mb = 512
    done = run_here(tasks, "--distribution=terminal_only", run_name="file")
    assert done.code == 0, done.stderr
    said = tool_results(samples(done.run_dir)["hello-file"][0])
    assert str(512 * 1024 * 1024) in said and "100000" in said  # 512 MB; one CPU: 100 ms of every 100 ms
    assert "wins over" not in done.stdout + done.stderr

    done = run_here(
        tasks, "--distribution=terminal_only", "--max_memory_mb=256", "--prompt_timeout=50", run_name="flag"
    )
    assert done.code == 0, done.stderr
    said = tool_results(samples(done.run_dir)["hello-file"][0])
    assert str(256 * 1024 * 1024) in said
    assert (done.stdout + done.stderr).count("--prompt_timeout (given) wins over task.toml's [agent] timeout") == 1


def test_a_changed_instruction_is_a_new_task_for_resume(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path)
    for name in ("sum-numbers", "fix-greeting"):
        shutil.rmtree(tasks / name)
    assert run_here(tasks, "--distribution=terminal_only").code == 0
    sent = len(server.chat_requests())
    with (tasks / "hello-file" / "instruction.md").open("a") as handle:
        handle.write("Then say done.\n")
    again = run_here(tasks, "--distribution=terminal_only", "--resume")
    assert again.code == 0, again.stderr
    assert len(server.chat_requests()) > sent  # unlike a fixed test (test_fixing_a_test_re_pays_nothing)


def test_a_changed_base_image_builds_the_task_image_again(docker_host, run_here, server, tmp_path):
    import docker

    client = docker.from_env()
    base = f"batch-runner-test/harbor-base-{uuid.uuid4().hex[:12]}:1"  # this test's own FROM
    client.images.get("batch-runner-test/harbor-base:1").tag(base)
    tasks = copy_examples(tmp_path)
    for name in ("sum-numbers", "fix-greeting"):
        shutil.rmtree(tasks / name)
    (tasks / "hello-file" / "environment" / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\n")
    try:
        builds = Builds(tasks)
        assert run_here(tasks, "--check_tasks", run_name="first").code == 0
        assert builds.count() == 1
        builds = Builds(tasks)
        assert run_here(tasks, "--check_tasks", run_name="same").code == 0
        assert builds.count() == 0
        changed = client.images.build(
            fileobj=io.BytesIO(f"FROM {base}\nRUN echo 2 > /x\n".encode()), network_mode="none"
        )
        changed[0].tag(base)
        builds = Builds(tasks)
        assert run_here(tasks, "--check_tasks", run_name="changed").code == 0
        assert builds.count() == 1
    finally:
        client.images.remove(base, force=True, noprune=True)  # its parents may be another build's cache
        client.close()


def test_a_python_verifier_is_refused_for_task_folders(run_here, server, tmp_path):
    verifier = tmp_path / "check.py"
    verifier.write_text("def check(record, env):\n    return 1.0\n")
    done = run_here(EXAMPLE, f"--verifier={verifier}:check")
    assert done.code == 2
    assert "--verifier does not apply to task folders" in done.stderr
    assert server.chat_requests() == []


def test_a_judge_is_refused_for_task_folders(run_here, server, tmp_path):
    """--judge was left unused without a word (each task's test.sh verifies it), as --verifier is not."""
    rubric = tmp_path / "rubric.md"
    rubric.write_text("Score 10 when the file says hello.\n")
    done = run_here(EXAMPLE, f"--judge={rubric}")
    assert done.code == 2, done.stderr
    assert "--judge does not apply to task folders: each is verified by its tests/test.sh" in done.stderr
    assert server.chat_requests() == []


def test_task_toml_times_never_loosen_the_runner_s(docker_host, run_here, server, tmp_path):
    """task.toml's timeouts were the file's, however long: build_timeout_sec = 1e11 was an OverflowError
    (exit 1) and 9e9 would hold the run at a build that never ends, before any sample; the agent's and
    test.sh's likewise. Each is now the lower of the file's and the flag's default (said once), so the
    honest twin, whose times are below them, keeps its own."""
    tasks = copy_examples(tmp_path, unique=True)
    shutil.rmtree(tasks / "sum-numbers")
    shutil.rmtree(tasks / "fix-greeting")
    shutil.copytree(tasks / "hello-file", tasks / "hello-honest")
    toml = tasks / "hello-file" / "task.toml"
    toml.write_text(
        toml.read_text()
        .replace("[agent]\ntimeout_sec = 120.0", "[agent]\ntimeout_sec = 1e11")
        .replace("[verifier]\ntimeout_sec = 60.0", "[verifier]\ntimeout_sec = 9e9")
        .replace("build_timeout_sec = 120.0", "build_timeout_sec = 1e11")
    )
    for name in ("hello-file", "hello-honest"):
        steer(tasks / name, "echo 'Hello, world!' > hello.txt")
    done = run_here(tasks, "--distribution=terminal_only")
    assert done.code == 0, done.stderr + done.stdout
    said = done.stdout + done.stderr
    for note in (
        "[agent] timeout_sec above --prompt_timeout (3600 s) cut to it",
        "[verifier] timeout_sec above --verify_timeout (300 s) cut to it",
        "[environment] build_timeout_sec above --setup_timeout (600 s) cut to it",
    ):
        assert said.count(note) == 1, said
    found = samples(done.run_dir)
    settings = {name: source(records[0])["harbor"]["settings"] for name, records in found.items()}
    times = {
        name: [value[key] for key in ("agent_timeout", "verify_timeout", "build_timeout")]
        for name, value in settings.items()
    }
    assert times == {"hello-file": [3600, 300, 600], "hello-honest": [120, 60, 120]}, times
    assert all(records[0]["metadata"]["verification"]["passed"] for records in found.values())


class Listener:
    """A TCP service on the host's loopback that records what connects to it (a registry's place)."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                connection, _ = self.socket.accept()
                connection.settimeout(3)
                with connection, contextlib.suppress(OSError):
                    self.seen.append(connection.recv(2000))

    def close(self) -> None:
        self.socket.close()


def test_a_task_folder_s_docker_image_is_never_pulled(docker_host, run_here, server, tmp_path):
    """A task.toml's docker_image was pulled when missing, from wherever its name points: the engine sent a
    TLS hello and GET /v2/ to a service on the host's loopback (as ADD <url> did before it was refused).
    Now an image a task folder names must be on the engine: else exit 2 at load naming the folder and the
    field, nothing sent anywhere; the honest twin names one that is there and is sound."""
    listener = Listener()
    try:
        tasks = copy_examples(tmp_path)
        shutil.rmtree(tasks / "sum-numbers")
        toml = tasks / "hello-file" / "task.toml"
        image = f"127.0.0.1:{listener.port}/internal/admin-endpoint:delete-everything"
        toml.write_text(toml.read_text() + f'docker_image = "{image}"\n')
        done = run_here(tasks, "--distribution=terminal_only")
        assert done.code == 2, done.stderr + done.stdout
        expected = f"{tasks / 'hello-file'}: [environment] docker_image {image!r} is not on the Docker engine"
        assert expected in done.stderr and "fix-greeting" not in done.stderr, done.stderr
        time.sleep(1)
        assert listener.seen == [] and server.chat_requests() == []
    finally:
        listener.close()

    toml.write_text(toml.read_text().replace(image, "batch-runner-test/harbor-base:1"))
    done = run_here(tasks, "--check_tasks", run_name="honest")
    assert done.code == 0, done.stderr + done.stdout
    assert "2 of 2 tasks sound" in done.stdout


def test_the_agent_finds_harbor_s_log_folder(docker_host, run_here, server, tmp_path):
    tasks = copy_examples(tmp_path)
    for name in ("sum-numbers", "fix-greeting"):
        shutil.rmtree(tasks / name)
    steer(tasks / "hello-file", "test -d /logs/agent && echo agent-logs-there")
    done = run_here(tasks, "--distribution=terminal_only")
    assert done.code == 0, done.stderr
    (record,) = samples(done.run_dir)["hello-file"]
    assert "agent-logs-there" in record["conversations"][3]["value"]


NOBODY = 65534
MARK = f"ROOTONLY{uuid.uuid4().hex[:12]}"  # in a file only root may read: never in a prompt, image or record


@pytest.fixture
def nobody_tasks(tmp_path):
    """A folder for task folders owned by nobody (in /tmp, which every user can reach), and a 0600 root
    file holding MARK in a 0700 root folder."""
    secret = root_only_folder(tmp_path, MARK)
    tasks = Path(tempfile.mkdtemp(prefix="nobody-tasks-", dir="/tmp"))
    try:
        tasks.chmod(0o755)
        yield tasks, secret / "secret.txt"
    finally:
        shutil.rmtree(tasks)


def owned_by_nobody(tasks: Path, names: list[str]) -> None:
    """Copies of the example hello-file named `names` in `tasks`, all of it nobody's."""
    for name in names:
        shutil.copytree(EXAMPLE / "hello-file", tasks / name)
    for path in [tasks, *tasks.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)


def test_a_root_runner_reads_a_task_folder_with_its_owner_s_rights(docker_host, nobody_tasks, run_here, server):
    """Issue 31, scope 2: a root runner read a task folder as root, so a file of it that only root may read
    (here a hard link, which its owner could not make with fs.protected_hardlinks) went into the /tests of a
    verification, the image built from environment/ or the oracle's /solution; and instruction.md, a link
    to such a file, became the prompt. Read as the folder's owner, without following a link, the load
    refuses each; the honest twin, the same folder with no such file, is read (by the helper, as nobody)
    and passes."""
    tasks, secret = nobody_tasks
    places = {
        "in-tests": "tests/hard.txt",
        "in-environment": "environment/hard.txt",
        "in-solution": "solution/hard.txt",
    }
    owned_by_nobody(tasks, [*places, "linked-instruction"])
    for name, where in places.items():
        os.link(secret, tasks / name / where)
    (tasks / "linked-instruction" / "instruction.md").unlink()
    (tasks / "linked-instruction" / "instruction.md").symlink_to(secret)
    done = run_here(tasks, "--distribution=terminal_only")
    assert done.code == 2, done.stdout + done.stderr
    said = done.stderr
    for name, where in places.items():
        assert f"{name}: {tasks / name / where}: Permission denied" in said, said
    assert said.count("uid 65534") == 3 and "linked-instruction: has no instruction.md" in said, said
    assert server.chat_requests() == [] and MARK not in done.stdout + said

    shutil.rmtree(tasks)
    tasks.mkdir(mode=0o755)
    owned_by_nobody(tasks, ["hello-file"])
    steer(tasks / "hello-file", "echo 'Hello, world!' > hello.txt")
    done = run_here(tasks, "--distribution=terminal_only", run_name="honest")
    assert done.code == 0, done.stdout + done.stderr
    (record,) = samples(done.run_dir)["hello-file"]
    assert record["metadata"]["verification"]["passed"] is True, record["metadata"]["verification"]


def test_a_task_folder_that_became_a_link_is_not_read(tmp_path):
    """The copies read a task folder by the path the load resolved; its owner, who may write the folder
    above it, swapped the task folder itself for a link to a folder only root may read: it was resolved
    again and read, as root when root owns the target. Now it is refused; the folder as loaded is read."""
    task = tmp_path / "tasks" / "hello-file"
    shutil.copytree(EXAMPLE / "hello-file", task)
    loaded = task.resolve()
    assert "test.sh" in task_files(loaded, "tests")  # the honest twin
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tests").mkdir(parents=True)
    (elsewhere / "tests" / "secret.txt").write_text(MARK)
    elsewhere.chmod(0o700)
    task.rename(tmp_path / "tasks" / "moved")
    task.symlink_to(elsewhere)
    with pytest.raises(Unreadable, match="a task folder is read only where the load found it"):
        task_files(loaded, "tests")


def test_a_task_folder_too_deep_to_walk_is_refused_with_a_message(tmp_path):
    """(review 10) The load walks a task folder with os.fwalk, which recurses once per folder level
    (Python 3.11): a dataset's task with a tests/ tree 1,200 folders deep ended the run with a RecursionError
    traceback, exit 1. It is Unreadable now, which the load says in one line, exit 2; the twin, the same
    task without the deep tree, is read."""
    task = tmp_path / "tasks" / "hello-file"
    shutil.copytree(EXAMPLE / "hello-file", task)
    assert "test.sh" in task_files(task, "tests")  # the honest twin
    fd = os.open(task / "tests", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1200):  # by descriptors: the path would be too long for one call
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    try:
        with pytest.raises(Unreadable, match="its folders lie too deep to be read"):
            task_files(task, "tests")
    finally:
        remove_tree(str(task))  # deeper than pytest's own clean-up can remove


def deepest_readable(folder: Path, readable: Callable[[], bool]) -> int:
    """A chain of folders d/d/d/... in `folder` (of its owner), as deep as the load still reads it (`readable`):
    its walk recurses once per level, in the helper that reads as the owner. A descriptor of the deepest."""
    owner = folder.stat()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for depth in itertools.count(1):  # by descriptors: the path would be too long for one call
        os.mkdir("d", dir_fd=fd)
        os.chown("d", owner.st_uid, owner.st_gid, dir_fd=fd)
        if depth > 980 and not readable():
            os.rmdir("d", dir_fd=fd)
            return fd
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    raise AssertionError("unreachable")


def reads(task: Path) -> bool:
    """Whether the load reads the task folder whole."""
    try:
        task_files(task)
    except Unreadable:
        return False
    return True


def test_a_link_out_at_the_bottom_of_a_deep_task_folder_is_found(nobody_tasks, run_here, server):
    """(review 10) The load looked for links out of environment/, tests/ and solution/ with os.walk, which
    recurses once per folder level (Python 3.11): a solution/ tree as deep as the owner's read goes (that
    read starts afresh in its own process) ended a root runner's load with a RecursionError traceback,
    exit 1. Its own stack finds the link at the bottom, refused in one line, exit 2; the honest twin, the
    same deep tree without the link, is loaded (and refused only for its environment)."""
    tasks, _ = nobody_tasks
    owned_by_nobody(tasks, ["hello-file"])
    fd = deepest_readable(tasks / "hello-file" / "solution", lambda: reads(tasks / "hello-file"))
    try:
        os.symlink("/etc/passwd", "passwd", dir_fd=fd)
        done = run_here(tasks, "--environment=bwrap")
        assert done.code == 2, done.stderr
        assert "/d/passwd is a link that leaves the task folder" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and server.chat_requests() == []

        os.unlink("passwd", dir_fd=fd)
        done = run_here(tasks, "--environment=bwrap", run_name="honest")
        assert done.code == 2, done.stderr
        assert "task folders run in Docker (hello-file)" in done.stderr, done.stderr
    finally:
        os.close(fd)
        remove_tree(str(tasks / "hello-file"))  # deeper than the fixture's own clean-up can remove


def test_a_part_of_a_task_folder_that_became_a_link_out_is_not_read(tmp_path):
    """The load refuses a link out of tests/, solution/ or environment/; one made after it (the folder's
    owner swaps tests/ for a link to a folder of root's) is not followed at the copy either."""
    task = tmp_path / "tasks" / "hello-file"
    shutil.copytree(EXAMPLE / "hello-file", task)
    assert "test.sh" in task_files(task, "tests")  # the honest twin
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret.txt").write_text(MARK)
    shutil.rmtree(task / "tests")
    (task / "tests").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Unreadable, match="outside"):
        task_files(task, "tests")


def image_task(tasks: Path, name: str, image: str, environment: str = "") -> Path:
    """A copy of hello-file that names its image in task.toml (used as it is, nothing built)."""
    task = tasks / name
    shutil.copytree(EXAMPLE / "hello-file", task)
    shutil.rmtree(task / "environment")
    toml = f'[verifier]\ntimeout_sec = 60.0\n\n[environment]\ndocker_image = "{image}"\n{environment}'
    (task / "task.toml").write_text(toml)
    return task


def test_a_docker_image_task_runs_its_image_as_is_with_the_same_defences(docker_host, run_here, server, tmp_path):
    """Nothing built; the image's WORKDIR, task.toml's memory, no network (allow_internet is not
    --sandbox_network), and verification in a fresh container, where a replaced /bin/cat is not."""
    tasks = tmp_path / "tasks"
    limits = "memory_mb = 300\nallow_internet = true\n"
    honest = image_task(tasks, "image-honest", "batch-runner-test/harbor-base:1", limits)
    steer(honest, f"echo 'Hello, world!' > hello.txt; pwd; ls /sys/class/net; {LIMITS}")
    steer(image_task(tasks, "image-cat", "batch-runner-test/harbor-base:1"), REPLACE_CAT)
    builds = Builds(tasks)
    done = run_here(tasks, "--distribution=terminal_only")
    assert done.code == 0, done.stderr + done.stdout
    assert builds.count() == 0 and not (done.run_dir / "builds").exists()
    found = {name: records[0] for name, records in samples(done.run_dir).items()}
    said = tool_results(found["image-honest"])
    assert "/app\\n" in said and "lo\\n" in said and "eth0" not in said and str(300 * 1024 * 1024) in said
    assert found["image-honest"]["metadata"]["verification"]["passed"] is True
    assert "planted\\nHello, world!" in tool_results(found["image-cat"])  # took hold in the agent's container
    assert (found["image-cat"]["metadata"]["verification"]["reward"]) == 0.0  # not in the fresh one


def test_a_node_without_the_task_folder_or_its_image_fails_before_any_model_call(docker_host, tmp_path):
    """A Ray node whose files or Docker engine are not the driver's: the sample is setup_failed, saying what
    is missing where, before its first model call (not a verification that could not read tests/)."""
    settings = EnvironmentSettings(kind="docker", run_dir=str(tmp_path), command_timeout=20)
    task = {"name": "elsewhere", "folder": str(tmp_path / "not-here"), "task_toml": "", "digest": "x"}
    folder = FolderSettings(agent_timeout=60, verify_timeout=60, build_timeout=60)
    image = "batch-runner-test/harbor-base:1"
    base = {"prompt": "p", "docker_image": image, "harbor": task | {"settings": asdict(folder)}}
    built = base | {"docker_image": image_tag("elsewhere", uuid.uuid4().bytes)}
    built["harbor"] = task | {"settings": asdict(replace(folder, build=True))}
    named = base | {"docker_image": f"batch-runner-test/not-on-this-node-{uuid.uuid4().hex[:8]}:1"}

    async def body():
        backend = backend_for(settings)
        with pytest.raises(SetupFailed, match="is not on this machine's Docker engine"):
            await backend.open(built)
        with pytest.raises(SetupFailed, match=r"the task's docker_image: .* the runner pulls no image"):
            await backend.open(named)
        env = await backend.open(base)
        try:
            with pytest.raises(SetupFailed, match=f"the task folder {tmp_path / 'not-here'} is not on this machine"):
                await prepare_task(env, base, NO_FOLDERS, 20)
        finally:
            await env.close()

    asyncio.run(body())
