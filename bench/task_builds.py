"""How long the images of a run's task folders take to build before its first sample: one build at a time
beside run/task_images.py's BUILDS_AT_ONCE, the wall time of each and their ratio.

    PYTHONPATH=. python bench/task_builds.py --tasks 6 --repeats 3

Each round copies the example tasks (data/example_harbor) into `--tasks` task folders whose Dockerfiles end
with a RUN step of their own (a nonce), so the engine builds every image afresh rather than from its layer
cache, and builds them through build_images as a run does. Needs an engine with the test images
(.ci/docker-up). The figure depends on the engine and the machine's free cores: builds that wait (on the
engine's container commits, on files) gain more from running together than builds that compute.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from trajforge.environments.docker import connect
from trajforge.environments.folder_task import FolderSettings
from trajforge.environments.limits import Limits
from trajforge.run.task_folders import build_context, environment_of, folder_digest, image_tag
from trajforge.run.task_images import BUILDS_AT_ONCE, build_images
from trajforge.verification.host_folders import task_files

EXAMPLE = Path(__file__).resolve().parent.parent / "data" / "example_harbor"


def fresh_tasks(where: Path, count: int) -> list[dict]:
    """`count` task folders in `where`, each of a build context no engine has seen, as the load's entries."""
    examples = sorted(path for path in EXAMPLE.iterdir() if (path / "task.toml").exists())
    entries = []
    for number in range(count):
        task = where / f"task-{number}"
        shutil.copytree(examples[number % len(examples)], task)
        with (task / "environment" / "Dockerfile").open("a") as dockerfile:
            dockerfile.write(f"RUN echo {uuid.uuid4().hex} > /tmp/nonce\n")
        files = task_files(task)
        tag = image_tag(task.name, build_context(environment_of(files)))
        settings = FolderSettings(60.0, 60.0, 300.0, build=True)
        harbor = {"name": task.name, "folder": str(task), "task_toml": "", "digest": folder_digest(files)}
        entries.append({"prompt": "p", "docker_image": tag, "harbor": harbor | {"settings": asdict(settings)}})
    return entries


def timed(tasks: int, at_once: int) -> float:
    with tempfile.TemporaryDirectory() as where:
        entries = fresh_tasks(Path(where), tasks)
        started = time.perf_counter()
        failed = build_images(entries, where, lambda _: None, Limits().max_processes, at_once)
        seconds = time.perf_counter() - started
    assert not failed, f"{failed} builds failed"
    client = connect()
    try:
        for entry in entries:  # the engine keeps none of the bench's images
            client.images.remove(entry["docker_image"], force=True)
    finally:
        client.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[int, list[float]] = {1: [], BUILDS_AT_ONCE: []}
    for _ in range(args.repeats):
        for at_once in times:  # alternated, so a busier moment of the machine falls on both
            times[at_once].append(timed(args.tasks, at_once))
    serial = statistics.median(times[1])
    for at_once, found in times.items():
        median = statistics.median(found)
        print(
            f"{args.tasks} builds, {at_once} at once: median {median:6.2f} s  max {max(found):6.2f} s  "
            f"x{median / serial:.2f} of one at a time"
        )


if __name__ == "__main__":
    main()
