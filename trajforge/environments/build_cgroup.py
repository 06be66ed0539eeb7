"""The cgroup a task folder's image build runs its RUN steps under, bounding their processes together at
--max_processes: the legacy builder's API takes no process limit, but it takes a cgroup parent for the
container of each step, and a cgroup's pids.max bounds everything below it. The runner makes one per build
(PREFIX and a random part, at the root of the hierarchy), writes its pids.max, passes "/<name>" as the
build's cgroup parent, and removes it after the build (the engine makes the same name in every other v1
hierarchy for its containers and leaves it there: those go too).

That holds only where the runner and the engine see one cgroup tree and the engine takes the parent as a
path in it: an engine on this machine (a unix socket served by a process of this process and cgroup
namespace: a runner in a container is not the engine's host), with the cgroupfs driver, of this machine's
cgroup version, whose hierarchy is mounted whole here, and a runner that may make cgroups there (root).
Elsewhere (a remote engine, the systemd driver, no rights) `place` says why, and the run says once that
builds have no process limit."""

from __future__ import annotations

import contextlib
import glob
import os
import socket
import struct
import time
import uuid
from collections.abc import Iterator

import docker

from trajforge.environments.limits import V1
from trajforge.environments.limits import V2 as CGROUPS

PREFIX = "batch-runner-build-"
V1_PIDS = V1["pids"]
REMOVE_WITHIN = 30.0  # seconds the engine has to remove a build's last container (a cancelled build's too)


def place(client: docker.DockerClient) -> tuple[str, str]:
    """(the hierarchy a build's cgroup is made in, "") for the engine of `client`, or ("", why not)."""
    socket_path = getattr(client.api.get_adapter(client.api.base_url), "socket_path", "")
    if not socket_path:
        return "", "the Docker engine is not on this machine (DOCKER_HOST is not a unix socket)"
    if why := _elsewhere(socket_path):
        return "", why
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
    if _mount_root(root) != "/":
        return "", f"{root} here is a part of its hierarchy (a container's view), not the engine's"
    if not (os.path.isdir(root) and os.access(root, os.W_OK)):
        return "", f"no cgroup can be made in {root} (run as root, with the engine's cgroup version)"
    return root, ""


def _elsewhere(socket_path: str) -> str:
    """Why the process serving `socket_path` does not see the cgroups as this one does ("": it does): it is
    in another process namespace (a container's, or the socket is forwarded) or another cgroup namespace."""
    try:
        with socket.socket(socket.AF_UNIX) as engine:
            engine.connect(socket_path)
            credentials = engine.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", credentials)[0]  # pid, uid, gid
        if not pid:
            return "the Docker engine is in another process namespace (a container's)"
        if os.readlink(f"/proc/{pid}/ns/cgroup") != os.readlink("/proc/self/ns/cgroup"):
            return "the Docker engine is in another cgroup namespace"
    except OSError as exc:
        return f"the Docker engine's cgroup namespace cannot be compared with this one's: {exc}"
    return ""


def _mount_root(path: str) -> str:
    """The folder of its file system that `path` is the mount of, in /proc/self/mountinfo ("" when it is none)."""
    # Lines end at newlines alone and fields at single spaces: a mount point's \r, \v or \f is left raw by the
    # kernel, and split there it could pass for a line or a field of its own (review 19).
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", newline="\n") as handle:
        for line in handle:
            fields = line.rstrip("\n").split(" ")
            if fields[4] == path:
                return fields[3]
    return ""


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
