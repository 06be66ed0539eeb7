"""The cgroup a task folder's image build runs its RUN steps under, bounding their processes together at
--max_processes: the legacy builder's API takes no process limit, but it takes a cgroup parent for the
container of each step, and a cgroup's pids.max bounds everything below it. The runner makes one per build
(PREFIX and a random part, at the root of the hierarchy), writes its pids.max, passes "/<name>" as the
build's cgroup parent, and removes it after the build (the engine makes the same name in every other v1
hierarchy for its containers and leaves it there: those go too).

That holds only where the runner and the engine see one cgroup tree and the engine takes the parent as a
path in it: an engine on this machine (a unix socket) with the cgroupfs driver, of this machine's cgroup
version, and a runner that may make cgroups there (root). Elsewhere (a remote engine, the systemd driver,
no rights) `place` says why, and the run says once that builds have no process limit."""

from __future__ import annotations

import contextlib
import glob
import os
import time
import uuid
from collections.abc import Iterator

import docker

PREFIX = "batch-runner-build-"
CGROUPS = "/sys/fs/cgroup"
V1_PIDS = f"{CGROUPS}/pids"
LOCAL = "http+docker://localhost"  # the SDK's base_url for an engine behind a unix socket
REMOVE_WITHIN = 30.0  # seconds the engine has to remove a build's last container (a cancelled build's too)


def place(client: docker.DockerClient) -> tuple[str, str]:
    """(the hierarchy a build's cgroup is made in, "") for the engine of `client`, or ("", why not)."""
    if client.api.base_url != LOCAL:
        return "", "the Docker engine is not on this machine (DOCKER_HOST is not a unix socket)"
    info = client.info()
    driver = info.get("CgroupDriver") or "unknown"
    if driver != "cgroupfs":
        return "", f"the Docker engine's cgroup driver is {driver}, not cgroupfs"
    if str(info.get("CgroupVersion") or "1") == "1":
        root = V1_PIDS
    elif "pids" in _words(f"{CGROUPS}/cgroup.subtree_control"):
        root = CGROUPS
    else:
        return "", "the pids controller is not enabled at the root of cgroup v2"
    if not (os.path.isdir(root) and os.access(root, os.W_OK)):
        return "", f"no cgroup can be made in {root} (run as root, with the engine's cgroup version)"
    return root, ""


def _words(path: str) -> list[str]:
    try:
        with open(path) as handle:
            return handle.read().split()
    except OSError:
        return []


@contextlib.contextmanager
def build_cgroup(root: str, processes: int) -> Iterator[str]:
    """A new cgroup under `root` with pids.max = `processes`, for one build: yields the cgroup parent to
    give the engine ("", none made, without a `root` or a limit); removed when the build is over. OSError
    when it cannot be made."""
    if not (root and processes):
        yield ""
        return
    name = PREFIX + uuid.uuid4().hex[:12]
    path = os.path.join(root, name)
    os.mkdir(path)
    try:
        with open(os.path.join(path, "pids.max"), "w") as handle:
            handle.write(str(processes))
        yield f"/{name}"
    finally:
        remove(name)


def remove(name: str) -> None:
    """Remove the build cgroup `name` from every hierarchy, once the engine has removed its containers'
    (waiting up to REMOVE_WITHIN seconds; a cgroup still in use then is left)."""
    deadline = time.monotonic() + REMOVE_WITHIN
    while True:
        left = glob.glob(f"{CGROUPS}/{name}") + glob.glob(f"{CGROUPS}/*/{name}")
        for path in left:
            with contextlib.suppress(OSError):
                os.rmdir(path)
        if not any(os.path.isdir(path) for path in left) or time.monotonic() > deadline:
            return
        time.sleep(0.1)
