"""A task folder's image built from its environment/ on the Docker engine: once per build context (its
tag is the context's digest, so an image already there is not built again, unless an image its FROM
names has changed since), with no network, within a deadline; the engine's output kept for a failure.

The legacy builder's API (the SDK's `build`) is used: it takes `network_mode` for every RUN, and the
engine cancels a build whose connection closes, which is how the deadline ends one. The engine would pull
an image a FROM names that it does not have, from its own network: no build starts from one that is
missing (task_images.py), and an ADD from a URL or git is refused at load (dockerfile.py)."""

from __future__ import annotations

import contextlib
import io
import json
import threading

import docker
from docker.errors import DockerException, ImageNotFound

from trajforge.environments.docker import connect
from trajforge.environments.dockerfile import images

RUNNER_LABEL = "batch-runner.harbor"  # on every image the runner built: `docker image prune --filter label=...`
BASES_LABEL = "batch-runner.harbor.from"  # the ids of the images its FROM lines named, when it was built


def bases(client: docker.DockerClient, dockerfile: str) -> dict[str, str]:
    """The images the Dockerfile's FROM and COPY --from name (not its own stages), each with its id on the
    engine ("" when it is not there: the run refuses to build from it, pulling nothing)."""
    found: dict[str, str] = {}
    for image in images(dockerfile):
        try:
            found[image] = client.images.get(image).id
        except DockerException:
            found[image] = ""
    return found


def current(client: docker.DockerClient, tag: str, made_from: dict[str, str]) -> bool:
    """Whether `tag` is on the engine, built from the images `made_from` names as they are now."""
    try:
        labels = client.images.get(tag).labels or {}
    except ImageNotFound:
        return False
    return labels.get(BASES_LABEL) == json.dumps(made_from, sort_keys=True)


def image_present(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except ImageNotFound:
        return False
    return True


def build(context: bytes, tag: str, timeout: float, made_from: dict[str, str]) -> tuple[bool, str]:
    """Build `context` (an uncompressed tar holding a Dockerfile) as `tag`: (built, the engine's output).
    The build has a client of its own, closed at the deadline, which ends the build on the engine too."""
    client = connect()
    said: list[str] = []
    failed: list[str] = []

    def run() -> None:
        try:
            stream = client.api.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                tag=tag,
                network_mode="none",
                rm=True,
                forcerm=True,
                decode=True,
                labels={RUNNER_LABEL: "1", BASES_LABEL: json.dumps(made_from, sort_keys=True)},
            )
            for chunk in stream:
                said.append(str(chunk.get("stream") or chunk.get("status") or ""))
                if "error" in chunk:
                    failed.append(str(chunk["error"]))
        except DockerException as exc:
            failed.append(str(exc))
        except Exception as exc:  # the connection closed under the stream at the deadline
            failed.append(f"{type(exc).__name__}: {exc}")

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        with contextlib.suppress(Exception):
            client.api.close()
        worker.join(30)
        return False, "".join(said) + f"\nthe build did not end within {timeout:g}s (build_timeout_sec)\n"
    try:
        if failed:
            return False, "".join(said) + "\n" + "\n".join(failed) + "\n"
        return image_present(client, tag), "".join(said)
    finally:
        client.close()
