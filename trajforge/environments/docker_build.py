"""A task folder's image built from its environment/ on the Docker engine: once per build context (its
tag is the context's digest, so an image already there is not built again, unless an image its FROM
names has changed since), with no network, within a deadline; the engine's output kept for a failure.

The legacy builder's API (/build, as the SDK's `build` asks it, plus a cgroup parent) is used: it takes
`networkmode` for every RUN, and the engine cancels a build whose connection closes, which is how the
deadline ends one. The engine would pull an image a FROM names that it does not have, from its own network:
no build starts from one that is missing (task_images.py), and an ADD from a URL or git is refused at load
(dockerfile.py).

A RUN step runs in a container of the engine's defaults (root in the image, Docker's default capabilities
and seccomp profile), bounded by the task's memory (the lower of task.toml's and --max_memory_mb, no swap)
and CPUs, and, where the runner can make it (build_cgroup.py), in a cgroup of the build whose pids.max is
--max_processes: the legacy builder's API takes no process limit, no ulimit and no security option. Only the
last OUTPUT_KEPT bytes of its output are kept, in memory and in the log."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
from collections.abc import Iterator

import docker
import requests
from docker.errors import DockerException, ImageNotFound, create_api_error_from_http_exception
from docker.utils.json_stream import json_stream

from trajforge.environments.docker import connect
from trajforge.environments.dockerfile import images
from trajforge.environments.folder_task import FolderSettings
from trajforge.tail import Tail

RUNNER_LABEL = "batch-runner.harbor"  # on every image the runner built: `docker image prune --filter label=...`
BASES_LABEL = "batch-runner.harbor.from"  # the ids of the images its FROM lines named, when it was built
OUTPUT_KEPT = 256 * 1024  # bytes of a build's output kept (its last), in memory and in builds/<task>.log
MB = 1024 * 1024


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
    """Whether the engine has `tag` (a name it cannot look up, such as "UPPER:1", it has not)."""
    try:
        client.images.get(tag)
    except DockerException:
        return False
    return True


def build_limits(client: docker.DockerClient, settings: FolderSettings) -> dict:
    """The container_limits of the build's RUN steps: the task's memory, swap included (none beyond it), and
    its CPUs as a set of the engine's (cpus = 1.5: two of them)."""
    limits: dict = {}
    if settings.memory_mb:
        limits["memory"] = limits["memswap"] = settings.memory_mb * MB
    if settings.cpus:
        count = min(math.ceil(settings.cpus), client.info().get("NCPU") or 1)
        limits["cpusetcpus"] = f"0-{count - 1}"
    return limits


def build(
    context: bytes, tag: str, settings: FolderSettings, made_from: dict[str, str], cgroup_parent: str = ""
) -> tuple[bool, str]:
    """Build `context` (an uncompressed tar holding a Dockerfile) as `tag`, within the task's build timeout
    and limits, its RUN steps' containers in `cgroup_parent` ("": the engine's own): (built, the last of the
    engine's output). The build has a client of its own, closed at the deadline, which ends the build on the
    engine too."""
    client = connect()
    said = Tail(OUTPUT_KEPT)
    failed: list[str] = []
    params = {
        "t": tag,
        "networkmode": "none",
        "rm": True,
        "forcerm": True,
        "labels": json.dumps({RUNNER_LABEL: "1", BASES_LABEL: json.dumps(made_from, sort_keys=True)}),
        **build_limits(client, settings),
        **({"cgroupparent": cgroup_parent} if cgroup_parent else {}),
    }

    responses: list[requests.Response] = []  # the build's, once the engine answers: shut at the deadline

    def run() -> None:
        try:
            for chunk in _stream(client, context, params, responses):
                said.feed(str(chunk.get("stream") or chunk.get("status") or "").encode())
                if "error" in chunk:
                    failed.append(str(chunk["error"])[:OUTPUT_KEPT])
        except DockerException as exc:
            failed.append(str(exc))
        except Exception as exc:  # the connection closed under the stream at the deadline
            failed.append(f"{type(exc).__name__}: {exc}")

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(settings.build_timeout)
    if worker.is_alive():
        with contextlib.suppress(Exception):
            for response in responses:
                _shut(response)
            client.api.close()
        worker.join(30)
        timeout = f"the build did not end within {settings.build_timeout:g}s (build_timeout_sec)"
        return False, _output(said, [timeout])
    try:
        if failed:
            return False, _output(said, failed)
        return image_present(client, tag), _output(said, [])
    finally:
        client.close()


def _stream(
    client: docker.DockerClient, context: bytes, params: dict, responses: list[requests.Response]
) -> Iterator[dict]:
    """The engine's /build, as the SDK's `build` asks it (which takes no cgroup parent), less the registry
    credentials it sends (no image is pulled): its output's objects as they come; its response is added to
    `responses`."""
    api = client.api
    response = api.post(
        f"{api.base_url}/v{api.api_version}/build",
        params=params,
        data=context,
        headers={"Content-Type": "application/tar"},
        stream=True,
        timeout=None,
    )
    responses.append(response)
    try:
        response.raise_for_status()
    except requests.HTTPError as exc:
        raise create_api_error_from_http_exception(exc) from None
    return json_stream(response.iter_content(chunk_size=None))


def _shut(response: requests.Response) -> None:
    """Shut the connection of a streaming response, which the engine takes as the build's cancel, and which
    wakes the thread reading it: closing the client's pool closes only the connections not in use, and
    closing a socket another thread reads from wakes nothing."""
    connection = getattr(response.raw, "connection", None)  # urllib3's, held by the stream until it ends
    if connection is not None and connection.sock is not None:
        connection.sock.shutdown(socket.SHUT_RDWR)


def _output(said: Tail, failed: list[str]) -> str:
    """The build's output as kept: its last bytes (saying how many came before), then why it failed."""
    cut = f"(the first {said.dropped} bytes of the build's output are not kept)\n" if said.dropped else ""
    return cut + said.text() + "".join(f"\n{why}" for why in failed) + ("\n" if said.data or failed else "")
