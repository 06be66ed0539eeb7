"""The docker backend against a real engine (.ci/docker-up starts a private one when none answers):
images and working directories, labels, leftovers, cancellation, and whole runs of batch_runner.py."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time

import docker
import pytest
from conftest import tool_results

from trajforge.environments import EnvironmentSettings, prepare_run
from trajforge.environments.docker import RUN_DIR_LABEL, RUN_LABEL, DockerBackend
from trajforge.environments.shell import KEEP_ALIVE
from trajforge.errors import SetupError

ALPHA, BETA = "batch-runner-test/alpha:1", "batch-runner-test/beta:1"  # beta has WORKDIR /srv/beta
MISSING = "127.0.0.1:9/batch-runner-test/missing:1"  # a pull of it goes to a closed loopback port


@pytest.fixture
def settings(docker_host, tmp_path) -> EnvironmentSettings:
    return EnvironmentSettings(
        kind="docker", command_timeout=10.0, default_image=ALPHA, run_name="docker-test", run_dir=str(tmp_path)
    )


def containers_of(run_dir) -> list:
    return docker.from_env().containers.list(all=True, filters={"label": f"{RUN_DIR_LABEL}={run_dir}"})


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


def test_ctrl_c_removes_the_running_prompts_containers(docker_host, run, tmp_path):
    entries = [{"prompt": f"[mock latency=30] slow {n}"} for n in range(2)]
    command = run.command(entries, "--environment=docker", f"--default_image={ALPHA}", "--concurrency=2")
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = (tmp_path / "out" / "run").resolve()
    try:
        deadline = time.monotonic() + 30
        while len(containers_of(run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(containers_of(run_dir)) == 2, "the prompts' containers never started"
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    assert not containers_of(run_dir)
