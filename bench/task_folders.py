"""What verifying a task folder's sample costs in docker, as Harbor does it (the clean room, a fresh
container of the task's image with the agent's work folder carried over, /tests, bash /tests/test.sh, the
reward file read), beside a plain `verify` command of a JSONL entry (the clean room, then the command, in a
fresh container of the image too since the red team's attacks on the agent's own): the median of each and
their ratio. Run it on an older tree as well to see what the fresh container costs a JSONL entry.

    PYTHONPATH=. python bench/task_folders.py --repeats 10

Both verify the same work (hello.txt of data/example_harbor/hello-file, written as the agent would) in
containers of the same image, built once from that task's environment/. Needs an engine with the test
images (.ci/docker-up).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import tomllib
from dataclasses import asdict
from pathlib import Path

from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.environments.docker import connect
from trajforge.environments.docker_build import bases, build, current
from trajforge.environments.folder_task import FolderSettings
from trajforge.run.task_folders import build_context, environment_of, folder_digest, image_tag
from trajforge.verification.checks import verify_sample
from trajforge.verification.host_folders import task_files
from trajforge.verification.result import VerifySettings

TASK = Path(__file__).resolve().parent.parent / "data" / "example_harbor" / "hello-file"
PLAIN = 'test "$(cat hello.txt)" = "Hello, world!"'


def entries() -> tuple[dict, dict]:
    """The task folder's entry (as the load makes it) and a JSONL entry with a plain verify command."""
    files = task_files(TASK)
    context = build_context(environment_of(files))
    tag = image_tag(TASK.name, context)
    text = (TASK / "task.toml").read_text()
    toml = tomllib.loads(text)
    settings = FolderSettings(60.0, toml["verifier"]["timeout_sec"], 300.0, build=True)
    client = connect()
    try:
        made_from = bases(client, (TASK / "environment" / "Dockerfile").read_text())
        if not current(client, tag, made_from):
            built, said = build(context, tag, settings, made_from)
            assert built, said
    finally:
        client.close()
    task = {"name": TASK.name, "folder": str(TASK), "task_toml": text, "digest": folder_digest(files)}
    folder = {"prompt": "p", "docker_image": tag, "harbor": task | {"settings": asdict(settings)}}
    return folder, {"prompt": "p", "image": tag, "verify": PLAIN}


async def measure(repeats: int) -> dict[str, list[float]]:
    plugins.load()  # the built-in backends, as a run registers them
    backend = backend_for(EnvironmentSettings(kind="docker", run_dir=tempfile.mkdtemp()))
    folder, plain = entries()
    times: dict[str, list[float]] = {"task folder": [], "plain verify": []}
    for _ in range(repeats):
        for name, entry in (("task folder", folder), ("plain verify", plain)):
            env = await backend.open(entry)
            try:
                await env.write_file("hello.txt", "Hello, world!\n")
                started = time.perf_counter()
                done = await verify_sample(VerifySettings(), entry, dict, [], env)
                times[name].append(time.perf_counter() - started)
                assert done["passed"], done
            finally:
                await env.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    times = asyncio.run(measure(parser.parse_args().repeats))
    plain = statistics.median(times["plain verify"])
    for name, found in times.items():
        median = statistics.median(found)
        print(f"{name:<14} median {median * 1000:7.0f} ms  max {max(found) * 1000:7.0f} ms  x{median / plain:.1f}")


if __name__ == "__main__":
    main()
