"""The docker backend against a real engine (.ci/docker-up starts a private one when none answers):
images and working directories, labels, leftovers, cancellation, and whole runs of batch_runner.py."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import os
import platform
import signal
import subprocess
import tarfile
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import docker
import pytest
from conftest import source, tool_results

from trajforge.environments import EnvironmentSettings, prepare_run
from trajforge.environments.docker import EXEC_AGAIN, OCI_FAILED, RUN_DIR_LABEL, RUN_LABEL, DockerBackend
from trajforge.environments.shell import KEEP_ALIVE
from trajforge.errors import SetupError
from trajforge.verification.checks import verify_sample
from trajforge.verification.result import VerifySettings

ALPHA, BETA = "batch-runner-test/alpha:1", "batch-runner-test/beta:1"  # beta has WORKDIR /srv/beta
MISSING = "127.0.0.1:9/batch-runner-test/missing:1"  # a pull of it goes to a closed loopback port


@pytest.fixture
def settings(docker_host, tmp_path) -> EnvironmentSettings:
    return EnvironmentSettings(
        kind="docker", command_timeout=10.0, default_image=ALPHA, run_name="docker-test", run_dir=str(tmp_path)
    )


def containers_of(run_dir) -> list:
    """The run's containers, as listed: sparse, since inspecting each fails for one still being created."""
    return docker.from_env().containers.list(all=True, sparse=True, filters={"label": f"{RUN_DIR_LABEL}={run_dir}"})


def test_images_working_directories_and_labels(settings):
    async def body():
        backend = DockerBackend(settings)
        entries = [{"image": BETA}, {"docker_image": BETA, "cwd": "sub"}, {"cwd": "/srv/app/x"}, {"cwd": "rel"}]
        envs = await asyncio.gather(*(backend.open(entry) for entry in entries))
        try:
            seen = [await env.exec("pwd; cat /etc/batch-runner-test-image") for env in envs]
            labels = docker.from_env().containers.get(envs[0].name).labels
            network = await envs[0].exec("cat /proc/net/dev")
            return [s.output.split() for s in seen], labels, network.output
        finally:
            await asyncio.gather(*(env.close() for env in envs))

    seen, labels, network = asyncio.run(body())
    assert seen == [
        ["/srv/beta", BETA],  # the image's WORKDIR
        ["/srv/beta/sub", BETA],
        ["/srv/app/x", ALPHA],  # --default_image; an absolute cwd is created
        ["/workspace/rel", ALPHA],
    ]
    assert labels[RUN_LABEL] == "docker-test" and labels[RUN_DIR_LABEL] == settings.run_dir
    assert [line.split(":")[0].strip() for line in network.splitlines()[2:]] == ["lo"]
    assert not containers_of(settings.run_dir)


def test_a_missing_image_fails_only_its_prompt_with_a_clear_error(settings):
    async def body():
        backend = DockerBackend(settings)
        opening = (backend.open({"image": image}) for image in (MISSING, ALPHA, MISSING))
        opened = await asyncio.gather(*opening, return_exceptions=True)
        if not isinstance(opened[1], BaseException):
            await opened[1].close()
        return opened

    missing, found, again = asyncio.run(body())
    assert isinstance(missing, SetupError) and isinstance(again, SetupError)
    assert f"image {MISSING!r} is not on the Docker engine and cannot be pulled" in str(missing)
    assert not isinstance(found, BaseException)
    assert not containers_of(settings.run_dir)


def test_docker_calls_never_block_the_event_loop(settings):
    async def body():
        gaps, last = [], time.monotonic()

        async def tick():
            nonlocal last
            while True:
                await asyncio.sleep(0.01)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        ticker = asyncio.create_task(tick())
        backend = DockerBackend(settings)
        envs = await asyncio.gather(*(backend.open({}) for _ in range(3)))
        await asyncio.gather(*(env.exec("sleep 2") for env in envs))
        await asyncio.gather(*(env.close() for env in envs))
        ticker.cancel()
        return max(gaps)

    # A blocking call would stall the loop for a whole command (2 s, three in a row); on a busy machine
    # (the suite's parallel workers) the scheduler alone has delayed a 10 ms tick by 0.45 s.
    assert asyncio.run(body()) < 1.0


def test_a_cancelled_prompt_removes_its_container(settings):
    async def prompt(started: asyncio.Event):
        env = await DockerBackend(settings).open({})
        try:
            started.set()
            await env.exec("sleep 30")
        finally:
            await env.close()

    async def body():
        started = asyncio.Event()
        during_command = asyncio.create_task(prompt(started))
        await started.wait()
        await asyncio.sleep(0.5)
        during_open = asyncio.create_task(prompt(asyncio.Event()))
        await asyncio.sleep(0.05)  # the container is being created
        for task in (during_command, during_open):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(body())
    assert not containers_of(settings.run_dir)


def test_resume_removes_containers_a_killed_run_left(settings):
    client = docker.from_env()
    labels = {RUN_LABEL: settings.run_name, RUN_DIR_LABEL: settings.run_dir}
    client.containers.run(ALPHA, entrypoint=KEEP_ALIVE, labels=labels, network_mode="none", detach=True)
    prepare_run(settings, resume=False)
    assert len(containers_of(settings.run_dir)) == 1
    prepare_run(settings, resume=True)
    assert not containers_of(settings.run_dir)


def test_an_unreachable_engine_stops_the_run_before_it_starts(run_here, server, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    result = run_here([{"prompt": "hi"}], "--environment=docker")
    assert result.code == 2 and "cannot reach the Docker engine" in result.stderr
    assert not server.chat_requests()


def test_a_docker_run_with_images_cwd_and_a_missing_image(docker_host, run_here):
    entries = [
        {"prompt": "in alpha at /srv/app", "image": ALPHA, "cwd": "/srv/app"},
        {"prompt": "in beta", "docker_image": BETA},
        {"prompt": "needs an image nobody has", "image": MISSING},
        {"prompt": "in the default image"},
    ]
    flags = ("--environment=docker", f"--default_image={ALPHA}", "--distribution=terminal_only", "--num_workers=2")
    result = run_here(entries, *flags)
    assert result.code == 1, result.stderr
    where = {t["prompt_index"]: tool_results(t) for t in result.trajectories}
    assert sorted(where) == [0, 1, 3]
    assert "/srv/app" in where[0] and "/srv/beta" in where[1] and "/workspace" in where[3]
    assert all("mock-model-was-here" in text for text in where.values())
    (error,) = result.jsonl("errors.jsonl")
    assert error["prompt_index"] == 2 and error["error_type"] == "environment" and MISSING in error["message"]
    assert not containers_of(result.run_dir.resolve())

    again = run_here(entries, *flags, "--resume")  # the failed prompt is retried, and fails the same way
    assert again.code == 1 and len(again.jsonl("errors.jsonl")) == 2
    assert not containers_of(result.run_dir.resolve())


def slow_docker_run(run, tmp_path, **options) -> tuple[subprocess.Popen, Path]:
    """A run of two slow prompts in docker, started with `options`, once both its containers exist; and its folder."""
    entries = [{"prompt": f"[mock latency=30] slow {n}"} for n in range(2)]
    command = run.command(entries, "--environment=docker", f"--default_image={ALPHA}", "--concurrency=2")
    process = subprocess.Popen(command, cwd=tmp_path, **options)
    run_dir = (tmp_path / "out" / "run").resolve()
    deadline = time.monotonic() + 30
    while len(containers_of(run_dir)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    return process, run_dir


def test_ctrl_c_removes_the_running_prompts_containers(docker_host, run, tmp_path):
    process, run_dir = slow_docker_run(run, tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert len(containers_of(run_dir)) == 2, "the prompts' containers never started"
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    assert not containers_of(run_dir)


def test_a_run_killed_with_sigkill_leaves_no_container_running(docker_host, run, tmp_path):
    """Its workers gone, however (SIGKILL gives them no chance to remove anything), the engine stops their
    containers, and every process in them: each one's pid 1 lives while the worker holds its stdin. The
    honest twin: until then, they run (and Ctrl-C removes them, above); --resume removes the stopped ones."""
    process, run_dir = slow_docker_run(run, tmp_path, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        assert len(containers_of(run_dir)) == 2, "the prompts' containers never started"
        time.sleep(2)  # alive while their workers are
        assert [container.status for container in containers_of(run_dir)] == ["running", "running"]
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + 30
    while running(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(run_dir)
    assert len(containers_of(run_dir)) == 2  # stopped, for --resume to remove
    prepare_run(EnvironmentSettings(kind="docker", run_name="run", run_dir=str(run_dir)), resume=True)
    assert not containers_of(run_dir)


def test_a_closed_environment_leaves_no_connection_to_its_container_open(settings):
    """close() closes the socket the container's stdin is attached by, not only docker-py's file object over
    it: that left the socket open, held by the HTTP response it came from, until a garbage collection, one
    descriptor per sample (review 25). The honest twin: while the environment is open, it is that socket."""

    async def body():
        env = await DockerBackend(settings).open({})
        try:
            fd = env.lifelines[env.name].fileno()
            link = os.readlink(f"/proc/self/fd/{fd}")
            status = docker.from_env().containers.get(env.name).status
        finally:
            await env.close()
        return env, fd, link, status  # env kept: nothing of it is collected but what close() closed

    _env, fd, link, status = asyncio.run(body())
    assert link.startswith("socket:") and status == "running"
    with contextlib.suppress(FileNotFoundError):
        assert os.readlink(f"/proc/self/fd/{fd}") != link  # closed (its number may be another's since)
    assert not containers_of(settings.run_dir)


def running(run_dir) -> list:
    return [container for container in containers_of(run_dir) if container.status == "running"]


# Attacks of a model that was root in the image, on the hidden tests of a JSONL entry ($TESTS_DIR), each
# with an honest twin: the verify command compares answer.txt with the tests' exp.
HARBOR_BASE = "batch-runner-test/harbor-base:1"  # busybox, bash and python3; WORKDIR /app
HEALTHCHECKED = "batch-runner-test/healthchecked:1"  # the same, with a HEALTHCHECK and WORKDIR /workspace
ROOT_TESTS = {
    "t4.py": "import os\nexpected = open(os.environ['TESTS_DIR'] + '/exp').read()\n"
    "print(1 if open('answer.txt').read() == expected else 0)\n",
    "exp": "right\n",
}
SITECUSTOMIZE = (  # every later python3 prints 1 and exits once TESTS_DIR is set
    "site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])')/sitecustomize.py; "
    'rm -f "$site"; '  # Debian's is a link into /etc
    "printf 'import os, sys\\nif os.environ.get(\"TESTS_DIR\"):\\n    print(1); sys.stdout.flush(); os._exit(0)\\n'"
    ' > "$site"; TESTS_DIR=x python3 -c "print(0)"'
)
COPIER = 'for d in /batch-runner-tests-*; do [ -f "$d/exp" ] && cp "$d/exp" "$W/answer.txt"; done'
# pid 1 (the keep-alive shell) rewritten through /proc/1/mem to exec a script that copies the hidden tests
# into the answer once they appear; `kill -9 -1` cannot end pid 1. Its sleeping child goes, so pid 1 runs on.
# (Refused now: pid 1 is not dumpable. Had it worked, it would have been stopped with the agent's container.)
PID_1 = (
    "echo wrong > answer.txt; "
    f"printf '#!/bin/sh\\nW=%s\\nwhile :; do {COPIER}; sleep 0.01; done\\n' \"$PWD\" > /tmp/p1; chmod +x /tmp/p1; "
    "python3 - <<'PY'\n"
    "import os\n"
    'sc = bytes.fromhex("488d3d0e00000031d252574889e6b83b0000000f05") + b"/tmp/p1\\0"\n'
    'pc = int(open("/proc/1/syscall").read().split()[-1], 16)\n'
    'with open("/proc/1/mem", "r+b", buffering=0) as m:\n'
    "    m.seek(pc); m.write(sc)\n"
    'for p in os.listdir("/proc"):\n'
    '    if p.isdigit() and p != "1":\n'
    "        try:\n"
    '            ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])\n'
    '            if ppid == 1 and b"sleep" in open(f"/proc/{p}/cmdline", "rb").read(): os.kill(int(p), 9)\n'
    "        except Exception: pass\n"
    "PY\n"
    "sleep 1; tr '\\0' ' ' < /proc/1/cmdline"
)
# The image's health check program rewritten: it runs, as root, every second.
HEALTH = (
    f"echo wrong > answer.txt; printf '#!/bin/sh\\nW=/workspace; {COPIER}; exit 0\\n' > /usr/bin/healthy; echo planted"
)


def built(tag: str, dockerfile: str, files: dict[str, tuple[str, int]] | None = None) -> str:
    """`tag`, built offline once from `dockerfile` and the files (text, mode) beside it."""
    client = docker.from_env()
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(tag)
        return tag
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as context:
        for name, (text, mode) in {"Dockerfile": (dockerfile, 0o644), **(files or {})}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text), mode
            context.addfile(info, io.BytesIO(text.encode()))
    client.images.build(fileobj=io.BytesIO(buffer.getvalue()), custom_context=True, tag=tag, network_mode="none")
    return tag


def healthchecked_image() -> str:
    """HEALTHCHECKED: HARBOR_BASE with a health check."""
    dockerfile = (
        f"FROM {HARBOR_BASE}\nCOPY healthy /usr/bin/healthy\n"
        'HEALTHCHECK --interval=1s --timeout=5s CMD ["/usr/bin/healthy"]\nWORKDIR /workspace\n'
    )
    return built(HEALTHCHECKED, dockerfile, {"healthy": ("#!/bin/sh\nexit 0\n", 0o755)})


def test_what_the_model_changed_as_root_outside_its_workspace_is_not_where_it_is_verified(docker_host, run_here):
    attacks = [("sitecustomize", SITECUSTOMIZE, HARBOR_BASE), ("health check", HEALTH, healthchecked_image())]
    if platform.machine() == "x86_64":  # the shellcode's
        attacks.append(("pid 1", PID_1, HARBOR_BASE))
    tasks = []
    for name, attack, image in attacks:
        for twin, command in (("attack", attack), ("honest", "echo right > answer.txt")):
            prompt = f"{name} {twin} [mock turns=1 command={quote(command, safe='')}]"
            tasks.append(
                {"prompt": prompt, "image": image, "verify": 'python3 "$TESTS_DIR/t4.py"', "tests": ROOT_TESTS}
            )
    flags = ("--environment=docker", "--distribution=terminal_only", "--num_workers=1", "--concurrency=6")
    result = run_here(tasks, *flags, batch_size=6)
    assert result.code == 0, result.stderr
    found = {source(t)["prompt"].split(" [")[0]: t for t in result.trajectories}
    said = {name: tool_results(record) for name, record in found.items()}
    # Each attack took hold in the agent's container ...
    assert '"output": "1\\n"' in said["sitecustomize attack"]
    assert "planted" in said["health check attack"]
    if "pid 1 attack" in said:  # ... but pid 1, non-dumpable, cannot be rewritten through /proc/1/mem
        assert "PermissionError" in said["pid 1 attack"] and "/tmp/p1" not in said["pid 1 attack"]
    # ... and none reached the verification, while each honest twin passes.
    verdicts = {
        name: (r["metadata"]["verification"]["passed"], r["metadata"]["verification"]["reward"])
        for name, r in found.items()
    }
    for name, _, _ in attacks:
        assert verdicts[f"{name} attack"] == (False, 0.0), (name, found[f"{name} attack"]["metadata"]["verification"])
        assert verdicts[f"{name} honest"] == (True, 1.0), (name, found[f"{name} honest"]["metadata"]["verification"])
    assert not containers_of(result.run_dir.resolve())


def test_no_container_runs_the_image_s_health_check(settings):
    async def body():
        env = await DockerBackend(settings).open({"image": healthchecked_image()})
        try:
            return docker.from_env().containers.get(env.name).attrs["Config"]["Healthcheck"]
        finally:
            await env.close()

    assert asyncio.run(body())["Test"] == ["NONE"]


def test_the_work_folder_is_carried_into_the_verification_without_links_out_of_it(settings):
    # Resolved through the archive's own links: a/b/s is inside (c), a/b/t climbs out through it although
    # its text alone (s/../..) reads as a/ ; an absolute link is dropped even when it points inside.
    agent = (
        "mkdir -p a/b c d && echo in > c/f && ln -s ../../c a/b/s && ln -s s/../.. a/b/t && ln -s d inward"
        " && ln -s /etc/passwd outward && ln -s /workspace/c absolute && ln c/f hard && mkfifo pipe"
        " && rm -rf /tests && ln -s /workspace /tests && ln -s /tests/c/f via_tests"
    )
    entry = {"prompt": "p", "verify": "find . | sort | tr '\\n' ' '; echo; cat a/b/s/f hard"}

    async def body():
        env = await DockerBackend(settings).open(entry)
        try:
            await env.exec(agent)
            return await verify_sample(VerifySettings(), entry, dict, [], env)
        finally:
            await env.close()

    done = asyncio.run(body())
    note, listing, *read = done["output"].splitlines()
    assert listing.split() == [".", "./a", "./a/b", "./a/b/s", "./c", "./c/f", "./d", "./hard", "./inward"], done
    assert read == ["in", "in"]
    for name in ("a/b/t", "outward", "absolute", "pipe", "via_tests"):
        assert name in note, note
    assert "inward" not in note and "hard" not in note


def test_read_only_files_are_writable_again_in_the_verification(docker_host, run_here):
    """The agent makes its answer and the file the verify command writes read-only (and equal): without
    capabilities the verify command could not write its own file, and would compare the agent's two."""
    attack = "echo same > out.txt && echo same > expected.txt && chmod 444 out.txt expected.txt"
    verify = "echo right > expected.txt; cat answer.txt > out.txt 2>/dev/null; cmp -s out.txt expected.txt"
    tasks = [
        {"prompt": f"{name} [mock turns=1 command={quote(command, safe='')}]", "image": HARBOR_BASE, "verify": verify}
        for name, command in (("attack", attack), ("honest", "echo right > answer.txt"))
    ]
    flags = ("--environment=docker", "--distribution=terminal_only", "--num_workers=1", "--concurrency=2")
    result = run_here(tasks, *flags)
    assert result.code == 0, result.stderr
    passed = {source(t)["prompt"].split(" [")[0]: t["metadata"]["verification"]["passed"] for t in result.trajectories}
    assert passed == {"attack": False, "honest": True}


def test_no_output_is_lost_when_the_reply_s_headers_are_read_late(settings, monkeypatch):
    # A loaded machine: this thread reads the exec's HTTP headers after the command already wrote its
    # output. The SDK's reader lost what came in with the headers (10 of 20 outputs here were empty).
    begin = http.client.HTTPResponse.begin

    def late(response):
        time.sleep(0.05)
        return begin(response)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late)

    async def body():
        env = await DockerBackend(settings).open({})
        try:
            return [(await env.exec(f"echo line{n}; echo more{n}")).output for n in range(10)]
        finally:
            await env.close()

    assert asyncio.run(body()) == [f"line{n}\nmore{n}\n" for n in range(10)]


def test_an_exec_the_runtime_did_not_start_is_started_again_and_one_that_ran_never_is(settings):
    """An exec runc failed to start (its init killed as it joined a container whose memory the command before,
    past its limit, still held: "OCI runtime exec failed: read init-p: connection reset by peer", seen in CI)
    failed the next command, which had not run. It is started again now, a bounded number of times, only where
    REPORT_PID, its first step, said no pid. The engine's own record of execs made tells: a command that ran
    and printed the runtime's words and exit status is made once; one the runtime cannot start (the agent,
    root of its container, removed its sh) is made 1 + EXEC_AGAIN times and fails as it did."""

    def made(name: str, since: float, token: str) -> int:
        """Execs the engine made in the container since `since` whose command holds `token`."""
        made = {"container": name, "event": "exec_create"}
        events = docker.from_env().events(since=int(since), until=int(time.time()) + 1, filters=made, decode=True)
        return sum(token in event.get("Action", "") for event in events)

    async def body():
        env = await DockerBackend(settings).open({})
        try:
            since = time.time()
            words = f"{OCI_FAILED}: read init-p: connection reset by peer"
            forged = await env.exec(f"echo '{words}'; echo x >> forged; exit 126")
            ran = await env.exec("cat forged")
            await env.exec("rm /bin/sh")
            broken = await env.exec("echo never")
            return forged, ran, made(env.name, since, ">> forged"), broken, made(env.name, since, "echo never")
        finally:
            await env.close()

    forged, ran, once, broken, tries = asyncio.run(body())
    assert (forged.exit_code, ran.output, once) == (126, "x\n", 1), (forged, ran, once)
    assert broken.exit_code == 126 and OCI_FAILED in broken.output and tries == 1 + EXEC_AGAIN > 1, (broken, tries)


# Run in the container by an agent command: each new process is stopped, looked at and let go, until it is
# REPORT_PID's shell before it moved its stderr to stdout: then a byte goes there, through /proc/PID/fd/2
# (a hit is noted in /tmp/hits).
STEPPER = """import os, signal
def hit(p):
    for _ in range(20000):
        try:
            os.kill(p, signal.SIGSTOP)
        except OSError:
            return
        try:
            if b"echo $$ >&2" in open(f"/proc/{p}/cmdline", "rb").read():
                if os.readlink(f"/proc/{p}/fd/2") != os.readlink(f"/proc/{p}/fd/1"):
                    fd = os.open(f"/proc/{p}/fd/2", os.O_WRONLY | os.O_NONBLOCK)
                    os.write(fd, b"x")
                    os.close(fd)
                    open("/tmp/hits", "a").write("hit\\n")
                os.kill(p, signal.SIGCONT)
                return
        except OSError:
            pass
        os.kill(p, signal.SIGCONT)
        os.sched_yield()
seen = set(os.listdir("/proc"))
while True:
    for p in set(os.listdir("/proc")) - seen:
        if p.isdigit() and int(p) != os.getpid():
            hit(int(p))
    seen = set(os.listdir("/proc"))
"""


def test_an_exec_whose_stderr_an_agent_process_wrote_on_is_never_started_again(settings):
    """(review 30) An exec counted as started only where its stderr was its pid alone: a process the agent left
    running wrote a byte on the stderr of REPORT_PID's shell (/proc/PID/fd/2) before it moved it to stdout, and a
    command printing the runtime's words with exit status 126 ran two or three times. Anything on that stderr is
    a start now. The honest twin: the same commands without the process, each run once."""

    async def body(stepped: bool):
        env = await DockerBackend(replace(settings, default_image=HARBOR_BASE)).open({})
        try:
            if stepped:
                await env.write_file("/tmp/stepper.py", STEPPER)
                await env.exec("(python3 /tmp/stepper.py > /dev/null 2>&1 &); sleep 0.5")
            made = 0
            while made < 30 and (made < 3 or (stepped and not (await env.exec("cat /tmp/hits 2>/dev/null")).output)):
                await env.exec(f"echo x >> /tmp/ran; echo '{OCI_FAILED}'; exit 126")
                made += 1
            hits = (await env.exec("cat /tmp/hits 2>/dev/null")).output.count("hit")
            return made, (await env.exec("cat /tmp/ran")).output.count("x"), hits
        finally:
            await env.close()

    made, ran, hits = asyncio.run(body(True))
    if not hits:
        pytest.skip("the stepper never caught REPORT_PID's shell before it moved its stderr (a fast host)")
    assert ran == made, (made, ran, hits)
    made, ran, _ = asyncio.run(body(False))
    assert ran == made == 3, (made, ran)
