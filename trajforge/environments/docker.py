"""The docker environment: one container per prompt, from the entry's image, through the docker SDK
(which honours DOCKER_HOST). The SDK blocks, so every call runs on a thread of the environment's
own: the worker's event loop, running many prompts at once, never waits on Docker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Mount

from trajforge.environments import (
    OUTPUT_LIMIT,
    Backend,
    EnvironmentSettings,
    ExecResult,
    container_cwd,
    image_of,
    seccomp,
)
from trajforge.environments.carried import carried, gathered
from trajforge.environments.contract import Spawned, timeout_result
from trajforge.environments.docker_exec import (
    STDERR,
    ContainerProcess,
    exec_stream,
    frames,
    output_reader,
    readable_archive,
)
from trajforge.environments.folder_task import IMAGE_PREFIX, FolderSettings, build_log
from trajforge.environments.limits import MB, OWN, Limits
from trajforge.environments.local import COMMAND_VARIABLES
from trajforge.environments.shell import KILL_ALL, CommandEnvironment, tar_archive
from trajforge.errors import SetupError, SetupFailed
from trajforge.tail import CappedOutput

RUN_LABEL, RUN_DIR_LABEL = "batch-runner.run", "batch-runner.run_dir"
DEFAULT_CWD = "/workspace"  # for images without a WORKDIR of their own
# An exec session leads its own process group; its pid on stderr lets a timeout kill the whole group.
# The command's own stderr goes to stdout, in order, as on the local backend.
REPORT_PID = ["sh", "-c", 'echo $$ >&2; exec "$@" 2>&1', "sh"]
# Input for a command travels as a file put next to it (exec has no simple stdin in the SDK).
# Removed once opened, before the command starts: no process of it finds the file in its workspace.
FROM_FILE = ["sh", "-c", 'f=$1; shift; exec < "$f"; rm -f -- "$f"; exec "$@"', "sh"]
KILL_GROUP = ["sh", "-c", 'kill -9 -"$1"', "sh"]
# A process of the sample left running (spawn: a stdio MCP server): its pid first on stderr, as REPORT_PID
# reports it, then its own stderr, apart from its stdout.
SERVE = ["sh", "-c", 'echo $$ >&2; exec "$@"', "sh"]
# pid 1 runs LIVE_WHILE_ATTACHED's loop from a copy of the image's sh that no one in the container may read (mode
# 0111, capabilities dropped): the kernel makes a process exec'd from an unreadable file non-dumpable, so
# the agent, of the same uid but without CAP_SYS_PTRACE, cannot open /proc/1/mem to rewrite it. Where no
# copy can be made or run, the plain loop. Verification never relies on it: it runs in a fresh container.
# Its loop reads the container's stdin, which the worker holds attached for the container's life: when the
# worker goes, however (SIGKILL too), the engine closes that stdin (StdinOnce), pid 1 ends, and the container
# stops with every process in it (--resume removes it, as before). A killed run left each one running, its
# commands and their CPU and memory, until then. Not removed by the engine on its exit (auto_remove): a
# verification reads the work folder of the agent's container once it is stopped (fresh_copy).
# Only the guarded copy keeps that stdin the engine's: pid 1 as the plain sh (no copy could be made) is the
# agent's to open (/proc/1/fd/0), and a process of the agent that holds it open for writing keeps the
# container running after the worker is gone (review 25), as before this lifeline.
LIVE_WHILE_ATTACHED = "while read -r _; do :; done"
GUARDED_KEEP_ALIVE = [
    "sh",
    "-c",
    'd=$(mktemp -d) && cp /bin/sh "$d/sh" && chmod 111 "$d/sh" && "$d/sh" -c true && exec "$d/sh" -c "$0"; '
    'exec sh -c "$0"',
    LIVE_WHILE_ATTACHED,
]
# A stdio MCP server's uid and gid in the container: not the agent's (the image's user, often root without
# capabilities), so no agent command reads its environment or memory (/proc/PID/environ, mem), traces or
# signals it; nor nobody, who owns the files it reads (readable_archive). The next one down where the
# image's user has it as its uid or gid. Nor any uid the runner gives a meaning on the host: a container's
# uid is the host's, and 65533 owns every bwrap worker's two-uid namespace (userns.py), 65532 runs pasta
# (netns.py) (review 18).
SERVER_UIDS = (65531, 65530, 65529)
# The folder $1 is, its links resolved (pwd -P: a builtin), as a command of the container finds it.
REAL_PATH = ["sh", "-c", 'cd -- "$1" && pwd -P', "sh"]
PROBE_AGAIN = 4  # times REAL_PATH is asked again when it answered nothing (the engine lost a quick exec's output)
# The uid and gid a command runs as ("UID:GID"), from the kernel's own record, read by the shell's builtins alone.
OWN_IDS = [
    "sh",
    "-c",
    "while read -r k v _; do case $k in Uid:) u=$v ;; Gid:) g=$v ;; esac; done < /proc/self/status; "
    '[ -n "$u" ] && [ -n "$g" ] && echo "$u:$g"',
]
KILL_GRACE = 5.0  # seconds to wait for a killed command's output to end
# An exec the runtime failed to start (runc's init killed as it joined a container whose memory a command past
# its limit still held: "OCI runtime exec failed: read init-p: connection reset by peer") is started again, up to
# EXEC_AGAIN times, EXEC_PAUSE seconds apart: nothing of it ran (REPORT_PID, its first step, wrote nothing on its
# stderr: the runtime says its failure on stdout), so the command runs once. One that started is never run again,
# whatever it printed or exited with: also where a process of the agent's wrote on that stderr through
# /proc/PID/fd/2 before REPORT_PID's shell moved it to stdout (its pid alone was asked for: review 30).
NOT_STARTED, OCI_FAILED = 126, "OCI runtime exec failed"
EXEC_AGAIN, EXEC_PAUSE = 2, 0.25
END_GRACE = 1.0  # seconds a killed server's output gets to end (a process it started outside its group holds it)
READABLE_MAX = 256 * MB  # bytes of host files a server reads, copied into each sample's container
CARRIED_MAX = 1024 * MB  # bytes of a working directory fresh_copy carries over into a new container
BUILD_LOG_TAIL = 4000  # characters of a failed build's output in the sample's error


def connect() -> docker.DockerClient:
    try:
        # Streams hold a connection each while a command runs: keep enough of them pooled.
        return docker.from_env(max_pool_size=64)
    except DockerException as exc:
        where = os.environ.get("DOCKER_HOST") or "the default socket (unix:///var/run/docker.sock)"
        raise SetupError(
            f"--environment=docker cannot reach the Docker engine at {where}: {exc}. "
            "Start Docker, or point DOCKER_HOST at a running engine."
        ) from None


def _reason(exc: DockerException) -> str:
    return str(getattr(exc, "explanation", None) or exc)


def image_workdir(client: docker.DockerClient, image: str, pull: bool) -> str:
    """Check the image is there (inspect, else pull when `pull`); returns its WORKDIR."""
    try:
        found = client.images.get(image)
    except ImageNotFound:
        if image.startswith(IMAGE_PREFIX):  # built by the run from a task folder, never pulled
            raise SetupError(f"image {image!r} was not built") from None
        if not pull:  # a task folder's docker_image: the engine would fetch it from wherever its name points
            raise SetupError(
                f"image {image!r} is not on the Docker engine, and the runner pulls no image a task folder names"
            ) from None
        try:
            found = client.images.pull(image)
        except DockerException as exc:
            reason = _reason(exc)
            raise SetupError(f"image {image!r} is not on the Docker engine and cannot be pulled: {reason}") from None
    except DockerException as exc:
        raise SetupError(f"image {image!r}: {_reason(exc)}") from None
    return found.attrs.get("Config", {}).get("WorkingDir") or ""


def container_limits(limits: Limits) -> dict:
    """The sample's limits as the container's own: for every process in it, the runner's untouched."""
    options: dict = {}
    if limits.max_processes:
        options["pids_limit"] = limits.max_processes
    if limits.max_memory_mb:
        options["mem_limit"] = f"{limits.max_memory_mb}m"
    if limits.max_file_size_mb:
        size = limits.max_file_size_mb * MB
        options["ulimits"] = [docker.types.Ulimit(name="fsize", soft=size, hard=size)]
        options["shm_size"] = f"{limits.max_file_size_mb}m"
    return options


def task_options(settings: EnvironmentSettings, folder: FolderSettings | None) -> tuple[EnvironmentSettings, dict]:
    """The settings and extra container options of a task folder's sample: its limits (the load made each
    the lower of task.toml's and the flag's), its network only where task.toml and --sandbox_network allow."""
    if folder is None:
        return settings, {}
    limits = replace(settings.limits, max_memory_mb=folder.memory_mb)
    settings = replace(settings, limits=limits, sandbox_network=settings.sandbox_network and folder.network)
    return settings, {"nano_cpus": int(folder.cpus * 1e9)} if folder.cpus else {}


def unshared(cwd: str, base: str) -> str:
    """Why the work folder `cwd` may not be the volume a servers' container mounts too, or "" where it may: it
    must lie in the image's own working folder `base` (its WORKDIR, else DEFAULT_CWD), which is not /. An entry's
    `cwd` is the dataset's to name: `"cwd": "/usr/lib/python3.11"` put that volume, the agent's to write, over the
    servers' standard library, and a module the agent rewrote there ran as the server, with its env (review 26)."""
    base = posixpath.normpath(base or DEFAULT_CWD)
    if base == "/" or cwd == "/":
        return "the image's working directory is /: no work folder to share with the servers' container"
    if cwd != base and not cwd.startswith(f"{base}/"):
        return (
            f"the work folder {cwd} lies outside the image's working directory {base}: it would be the agent's "
            "to write in the servers' container too"
        )
    return ""


class DockerEnvironment(CommandEnvironment):
    def __init__(
        self,
        client: docker.DockerClient,
        image: str,
        cwd: str,
        settings: EnvironmentSettings,
        options: dict,
        base: str = DEFAULT_CWD,
    ):
        self.client, self.api, self.image, self.cwd, self.settings = client, client.api, image, cwd, settings
        self.options = options  # more of the container's options (a task folder's cpus)
        # Its stdio servers run in the user's image (--default_image, where the run's start listed their tools),
        # never in an entry's `image` or task folder's: the dataset's, whose `python` would run with the server's
        # env (review 27). `base`: that image's working directory.
        self.servers_image = settings.default_image
        # Why its stdio servers get no container of their own, sharing the work folder (none where there are none)
        self.unshared = unshared(cwd, base) if settings.stdio_servers else "no stdio MCP server was configured"
        self.name = f"batch-runner-{uuid.uuid4().hex[:12]}"
        # One thread runs this container's calls in order, so close() removes a container whose
        # creation was still under way when the prompt was cancelled. Others read command output: a
        # detached process that keeps a timed-out command's output open holds its reader until close().
        self.calls = ThreadPoolExecutor(1, thread_name_prefix="docker-calls")
        self.readers = ThreadPoolExecutor(4, thread_name_prefix="docker-output")
        self.exec_env: dict[str, str] = {}  # TESTS_DIR, once add_tests wrote them
        self.lifelines: dict[str, object] = {}  # each container's stdin, attached: its pid 1 lives while that is open
        self.server_user = ""  # uid:gid of its stdio MCP servers (SERVER_UIDS), found at the first spawn
        self.servers = ""  # the container its stdio MCP servers run in, once the first started (_servers_room)
        # uid:gid every command of the agent's runs as: the image's user, told in numbers at the start, before
        # any command. Docker looks a named user (`USER root`, `USER app`) up in the container's /etc/passwd
        # at each exec, which the agent (root, or where it is writable) rewrites: `root:x:65531:...` made its
        # next command the server's uid, reading the server's environment (review 19). "" where they could
        # not be told (no server then: _server_user).
        self.agent_user = ""

    async def _call(self, function, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self.calls, partial(function, *args, **kwargs))

    async def start(self) -> None:
        # With stdio MCP servers the work folder is a volume of its own (its image's files copied in at its
        # creation), which their container mounts too (_servers_room), where it lies in their image's own (unshared).
        shared = not self.unshared
        mounts = [Mount(self.cwd, None, type="volume", labels=self._labels())] if shared else []
        try:
            await self._call(self._create, self.name, mounts=mounts)
            await self._call(self._attach_and_start, self.name)
        except DockerException as exc:
            raise SetupError(f"cannot start a container from {self.image!r}: {_reason(exc)}") from None
        said = await self.run(OWN_IDS, self.settings.command_timeout)
        uid, _, gid = said.output.strip().partition(":")
        if not said.exit_code and uid.isdecimal() and gid.isdecimal():
            self.agent_user = f"{int(uid)}:{int(gid)}"

    def _labels(self) -> dict[str, str]:
        return {RUN_LABEL: self.settings.run_name, RUN_DIR_LABEL: self.settings.run_dir}

    def _create(self, name: str, image: str = "", **more) -> None:
        """A container of the sample's, the agent's (its image) or its stdio servers' (`image`), with its limits."""
        self.client.containers.create(
            image or self.image,
            entrypoint=GUARDED_KEEP_ALIVE,  # overrides any entrypoint of the image
            name=name,
            labels=self._labels(),
            working_dir=self.cwd,  # created by Docker when missing
            environment=COMMAND_VARIABLES,
            network_mode=None if self.settings.sandbox_network else "none",
            cap_drop=["ALL"],  # root in the container can neither remount, nor trace, nor open raw sockets
            # No setuid program gives it back; the seccomp profile denies taking another process's
            # memory or descriptors (seccomp.py), whatever the host's Yama setting.
            security_opt=["no-new-privileges", f"seccomp={seccomp.docker_profile()}"],
            healthcheck={"test": ["NONE"]},  # the image's own would run, as root, while verification runs
            **container_limits(self.settings.limits),
            **self.options,
            # stdin kept open, and closed by the engine once its one attached client (ours) is gone
            stdin_open=True,
            detach=False,  # docker-py sets StdinOnce only so; nothing is attached but our stdin
            **more,
        )

    def _attach_and_start(self, name: str) -> None:
        """On the calls thread: a start cancelled while attaching still leaves its socket in `lifelines`, for
        close() (run after it on that thread) to close. Attached before it starts: a worker killed between the
        two leaves a container created, never one running with no one attached (review 25)."""
        self.lifelines[name] = self.api.attach_socket(name, {"stdin": 1, "stream": 1})
        self.api.start(name)

    async def end_agent_processes(self) -> None:
        await self.run(KILL_ALL, 30)

    async def run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> ExecResult:
        return await self._exec(self.name, self.agent_user, argv, timeout, stdin, limit)

    async def _exec(
        self,
        container: str,
        user: str,
        argv: list[str],
        timeout: float,
        stdin: bytes | None = None,
        limit: int = OUTPUT_LIMIT,
    ) -> ExecResult:
        """argv run in `container` (the agent's, or its servers') as `user`, as `run` describes."""
        if stdin is not None:
            staged = f"{self.cwd.rstrip('/')}/.batch-runner-input-{uuid.uuid4().hex}"
            await self._call(self.api.put_archive, container, self.cwd, tar_archive({os.path.basename(staged): stdin}))
            argv = [*FROM_FILE, staged, *argv]
        command = [*REPORT_PID, *argv]
        for _ in range(EXEC_AGAIN):
            done, started = await self._exec_once(container, user, command, timeout, limit)
            if started or done.exit_code != NOT_STARTED or OCI_FAILED not in done.output:
                return done
            await asyncio.sleep(EXEC_PAUSE)
        return (await self._exec_once(container, user, command, timeout, limit))[0]

    async def _exec_once(
        self, container: str, user: str, command: list[str], timeout: float, limit: int
    ) -> tuple[ExecResult, bool]:
        """One exec of `command`, and whether it started: REPORT_PID, its first step, wrote on its stderr (its pid; the
        runtime's own failure comes on stdout). Only a timeout's kill needs the pid alone there."""
        exec_id = (
            await self._call(self.api.exec_create, container, command, environment=self.exec_env or None, user=user)
        )["Id"]
        response = await self._call(exec_stream, self.api, exec_id)
        output, pid = CappedOutput(limit), bytearray()

        def drain() -> None:
            with response:
                for stream, data in frames(output_reader(response)):
                    (pid.extend if stream == STDERR else output.feed)(data)

        reading = asyncio.get_running_loop().run_in_executor(self.readers, drain)
        try:
            await asyncio.wait_for(asyncio.shield(reading), timeout)
        except TimeoutError:
            if pid.strip().isdigit():
                await self._kill_group(container, user, pid.decode().strip())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reading), KILL_GRACE)
            return timeout_result(output.text(), timeout), True
        return ExecResult(output.text(), await self._exit_code(exec_id)), bool(pid)

    async def spawn(
        self, argv: list[str], variables: dict[str, str], read_only: tuple[str, ...] = (), limit: int = 1 << 16
    ) -> Spawned:
        """An exec in the container, as its commands run (the container's limits and network, no capability)
        but as a uid of its own (SERVER_UIDS), from its work folder, with stdin attached. `read_only` is
        copied in at the same paths (readable_archive): the engine may be on another machine, where no host
        path could be mounted."""
        try:
            if self.unshared:  # before the paths are compared: a work folder there is none to share (a relative one)
                raise OSError(self.unshared)
            # Copied in there, it would lie in the work folder's volume: the agent's to rewrite before a server reads.
            shared = (path for path in read_only if posixpath.commonpath([path, self.cwd]) in (path, self.cwd))
            overlap = next(shared, "")
            if overlap:
                raise OSError(f"{overlap}, which its config gives it, and the work folder {self.cwd} overlap")
            room = await self._servers_room()
            if read_only:
                archive = await asyncio.to_thread(readable_archive, read_only, READABLE_MAX)
                await self._call(self.api.put_archive, room, "/", archive)
            command, variables = [*SERVE, *argv], {**self.exec_env, **variables}
            user = await self._server_user()
            created = await self._call(
                self.api.exec_create,
                room,
                command,
                stdin=True,
                environment=variables,
                workdir=self.cwd,
                user=user,
            )
            exec_id = created["Id"]
            response = await self._call(exec_stream, self.api, exec_id)
        except DockerException as exc:
            raise OSError(f"cannot start it in the container: {_reason(exc)}") from None
        process = ContainerProcess(response, limit)
        watching = asyncio.ensure_future(self._watch(exec_id, process))
        return Spawned(process, lambda: asyncio.shield(self._end_spawned(process, watching)))

    async def _servers_room(self) -> str:
        """The container of the sample's stdio servers, started for the first: its image, limits and network, its
        servers' uid, and of the agent's container only the work folder (its volume, at the same path). The agent,
        root of its own container's files, cannot change a program or a module a server runs or imports later,
        which would run as the server, with its env (review 19), nor see or signal a process of the servers'.
        Its caller (spawn) refuses first where there is no work folder to share, or one reached through a link."""
        if not self.servers:
            user = await self._server_user()
            # Docker mounts an image's VOLUME after the work folder's volume, through the links there: the agent's
            # `data -> /opt/mcp` (where the agent's own image has none) put it over the server's program (review 27).
            inside = [path for path in await self._call(self._image_volumes) if path.startswith(f"{self.cwd}/")]
            if inside:
                self.unshared = f"the image's VOLUME {inside[0]} lies in the work folder {self.cwd}"
                raise OSError(self.unshared)
            # That volume alone, by its name: volumes_from gave the servers' container every volume of the agent's,
            # an image's VOLUME too (the agent's to write, as /opt/lib, whose modules a server imports: review 26).
            # Not filled again from the image should the agent have emptied it (no_copy): the work folder is its.
            work = Mount(self.cwd, await self._call(self._work_volume), type="volume", no_copy=True)
            self.servers = f"{self.name}-servers"  # before it is made: close() removes one whose making was cut short
            await self._call(self._create, self.servers, self.servers_image, user=user, mounts=[work])
            await self._call(self._attach_and_start, self.servers)
            # Docker followed the image's links to mount the volume (/app/lib -> /usr/lib put it over the system):
            # where the work folder is as its container finds it, before anything runs there.
            real = await self._real_path(user)
            if real != self.cwd:
                self.unshared = f"the work folder {self.cwd} is reached through a link of the image ({real or '?'})"
                raise OSError(self.unshared)
        return self.servers

    def _image_volumes(self) -> list[str]:
        """The VOLUMEs the servers' image declares, their paths normalised."""
        volumes = self.client.images.get(self.servers_image).attrs.get("Config", {}).get("Volumes") or {}
        return [posixpath.normpath(path) for path in volumes]

    async def _real_path(self, user: str) -> str:
        """The work folder's path, links resolved, as a command of the servers' container finds it ("" where it
        cannot: cd failed). Asked again when it exited 0 and said nothing: the engine lost a quick exec's output."""
        for _ in range(1 + PROBE_AGAIN):
            said = await self._exec(self.servers, user, [*REAL_PATH, self.cwd], self.settings.command_timeout)
            if said.exit_code or said.output.strip():
                break
            await asyncio.sleep(0.2)
        return "" if said.exit_code else said.output.strip()

    def _work_volume(self) -> str:
        """The name of the volume the agent's container has at its work folder (start)."""
        mounts = self.api.inspect_container(self.name)["Mounts"]
        for mount in mounts:
            if mount.get("Type") == "volume" and mount.get("Destination") == self.cwd and mount.get("Name"):
                return mount["Name"]
        raise OSError(f"the sample's container has no volume at its work folder {self.cwd}")

    async def _server_user(self) -> str:
        """uid:gid for a server: the first of SERVER_UIDS that is neither the uid nor the gid the agent's commands
        run as (agent_user, read by the shell itself at the start: no `id` in the image to miss or lie, and pinned, so
        no later /etc/passwd makes it another). Where it could not be told, no server: one of the agent's uid
        would give the agent its environment and memory."""
        if not self.server_user:
            if not self.agent_user:
                raise OSError("cannot tell the uid the image's commands run as (its sh could not read it)")
            agent = {int(number) for number in self.agent_user.split(":")}  # nor its gid: a group shares files
            uid = next(uid for uid in SERVER_UIDS if uid not in agent)
            self.server_user = f"{uid}:{uid}"
        return self.server_user

    async def _watch(self, exec_id: str, process: ContainerProcess) -> None:
        """Once its output ended: its exit status, then the end of its streams."""
        code = None
        try:
            await process.received
            code = await self._exit_code(exec_id)
        except (DockerException, RuntimeError):  # the container, or this environment, is gone
            pass
        finally:
            process.ended(code)

    async def _end_spawned(self, process: ContainerProcess, watching: asyncio.Future) -> None:
        """Its output no longer read (ContainerProcess.shut), then its process group killed (a process it
        started outside its group: the container's end kills that one), its exit status awaited END_GRACE."""
        process.shut()
        try:
            with contextlib.suppress(TimeoutError):
                pid = await asyncio.wait_for(asyncio.shield(process.pid), END_GRACE)
                if pid.isdigit():
                    with contextlib.suppress(DockerException, RuntimeError):  # RuntimeError: the environment closed
                        await self._kill_group(self.servers, self.server_user, pid)  # as the server's uid
                await asyncio.wait_for(watching, END_GRACE)
        finally:
            process.close()

    async def _kill_group(self, container: str, user: str, pid: str) -> None:
        """Process group `pid` of `container` killed, by a command as `user` (one of another uid may not signal it)."""
        kill = await self._call(self.api.exec_create, container, [*KILL_GROUP, pid], user=user)
        await self._call(self.api.exec_start, kill["Id"])

    async def add_tests(self, files: dict[str, bytes]) -> None:
        # A folder of a name no one could guess, made only after every process of the agent is gone.
        await self.end_agent_processes()
        folder = f"batch-runner-tests-{uuid.uuid4().hex}"
        tar = tar_archive({posixpath.join(folder, posixpath.normpath(name)): data for name, data in files.items()})
        await self._call(self.api.put_archive, self.name, "/", tar)
        await self.run(["mkdir", "-p", f"/{folder}"], self.settings.command_timeout)
        self.tests_dir = f"/{folder}"
        self.exec_env = {"TESTS_DIR": self.tests_dir}

    async def put_folder(self, path: str, files: dict[str, bytes]) -> None:
        await self.run(["rm", "-rf", "--", path], self.settings.command_timeout)
        tar = tar_archive({posixpath.join(path.lstrip("/"), name): data for name, data in files.items()})
        await self._call(self.api.put_archive, self.name, "/", tar)
        made = await self.run(["mkdir", "-p", "--", path], self.settings.command_timeout)
        if made.exit_code:
            raise OSError(f"cannot make {path} in the container: {made.output.strip()}")

    async def verification_room(self) -> DockerEnvironment:
        # The agent was root in its container: what it changed outside its work folder (a sitecustomize.py,
        # pid 1, the image's health check) stays there, with the container.
        return await self.fresh_copy()

    async def fresh_copy(self) -> DockerEnvironment:
        if self.cwd == "/":
            raise OSError("the working directory is /: there is no work folder to carry into a fresh container")
        # Nothing of the agent (nor of a server) runs while its work folder is read: its container stops, whatever
        # pid 1 became.
        for name in self._containers():
            with contextlib.suppress(APIError):  # already stopped
                await self._call(self.api.kill, name)
        stream, _ = await self._call(self.api.get_archive, self.name, self.cwd)
        with await self._call(gathered, stream, CARRIED_MAX) as archive:
            work, dropped = await self._call(carried, archive, posixpath.basename(self.cwd))
        # No server runs in the verification's container: its work folder is no volume to share.
        fresh = DockerEnvironment(
            self.client, self.image, self.cwd, replace(self.settings, stdio_servers=False), self.options
        )
        fresh.dropped = tuple(dropped)
        fresh.packs = self.packs  # the packs the task left (agent_begins), carried at the same paths
        with work:
            try:
                await fresh.start()
                await fresh.run(["rm", "-rf", "--", self.cwd], self.settings.command_timeout)
                await fresh._call(self.api.put_archive, fresh.name, posixpath.dirname(self.cwd), work)
            except BaseException:
                await fresh.close()
                raise
        return fresh

    async def _exit_code(self, exec_id: str) -> int:
        # The engine can report the exec as running for a moment after its output ended.
        for _ in range(50):
            state = await self._call(self.api.exec_inspect, exec_id)
            if not state["Running"]:
                return state["ExitCode"]
            await asyncio.sleep(0.02)
        return -1 if state["ExitCode"] is None else state["ExitCode"]

    async def close(self) -> None:
        try:
            await self._call(self._remove)
        finally:
            self.calls.shutdown(wait=False)
            self.readers.shutdown(wait=False)

    def _containers(self) -> list[str]:
        """The sample's containers, its servers' first: the work folder's volume goes with the agent's."""
        return [name for name in (self.servers, self.name) if name]

    def _remove(self) -> None:
        # By name: the container may exist although the call that created it never returned.
        # A failure here must not fail the prompt; the run's end (or --resume) removes leftovers by label.
        for name in self._containers():
            with contextlib.suppress(DockerException):
                self.api.remove_container(name, force=True, v=True)
        for lifeline in self.lifelines.values():  # after the removal: its closing would end the container, as a stop
            hang_up(lifeline)
        self.lifelines.clear()


def hang_up(lifeline) -> None:
    """Close an attach_socket's connection. docker-py returns the socket's file object (a SocketIO; on TLS the
    socket), whose close() only drops its own reference: the socket stayed open, held by the HTTP response it
    came from (kept as `_response`) until a garbage collection, one descriptor per sample (review 25)."""
    response = getattr(lifeline, "_response", None)
    if response is not None:  # first: it flushes the file object, which must still be open (ValueError)
        with contextlib.suppress(Exception):  # the connection's close; nothing of it matters once it is gone
            response.close()
    with contextlib.suppress(OSError):
        lifeline.close()


def build_failure(settings: EnvironmentSettings, entry: dict) -> SetupFailed:
    """A task folder's sample whose image did not build: the build's output, kept in the run folder."""
    log, image = build_log(settings.run_dir, entry), entry["docker_image"]
    try:
        with open(log, encoding="utf-8", errors="replace") as handle:
            said = handle.read()[-BUILD_LOG_TAIL:]
    except OSError:  # no failed build: the image was built, on another engine (a Ray node's own)
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        return SetupFailed(
            f"the task's image {image!r} is not on this machine's Docker engine ({where}): the run builds it on "
            "the driver's engine before any sample starts; every Ray node must use that engine or have the "
            "image loaded (docs/tasks.md)"
        )
    return SetupFailed(f"the task's image {image!r} did not build (output in {log}):\n{said}")


class DockerBackend(Backend):
    LIMITS = OWN

    def __init__(self, settings: EnvironmentSettings):
        super().__init__(settings)
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="docker-images")
        self.shared: dict[str, asyncio.Future] = {}  # the client, then each image's WORKDIR or SetupError

    async def _once(self, key: str, function, *args):
        """function(*args) once per worker process; later callers get the same result or error."""
        if key not in self.shared:
            self.shared[key] = asyncio.get_running_loop().run_in_executor(self.pool, function, *args)
        return await asyncio.shield(self.shared[key])  # a cancelled prompt must not cancel it for the others

    async def environment(self, entry: dict, sample: str = "") -> DockerEnvironment:
        client = await self._once("client", connect)
        image = image_of(entry, self.settings)
        folder = FolderSettings.of(entry)
        try:
            workdir = await self._once(f"image:{image}", image_workdir, client, image, folder is None)
        except SetupError as exc:
            if folder and folder.build:
                raise build_failure(self.settings, entry) from None
            if folder:  # task.toml's docker_image: the task's own setup, as a failed build is
                raise SetupFailed(f"the task's docker_image: {exc}") from None
            raise
        settings, options = task_options(self.settings, folder)
        base = workdir or DEFAULT_CWD
        servers_base = base  # the working directory of the image its stdio servers run in (--default_image)
        if settings.stdio_servers:  # looked up once (_once): the entry's own, where it is that image
            default = settings.default_image
            servers_base = await self._once(f"image:{default}", image_workdir, client, default, True) or DEFAULT_CWD
        return DockerEnvironment(client, image, container_cwd(entry, base), settings, options, servers_base)

    @classmethod
    def check(cls, settings: EnvironmentSettings) -> None:
        connect().close()

    @classmethod
    def remove_leftovers(cls, settings: EnvironmentSettings) -> None:
        client = connect()
        try:
            label = {"label": f"{RUN_DIR_LABEL}={settings.run_dir}"}
            found = client.containers.list(all=True, filters=label)
            # A sample's servers' container before its agent's: the work folder's volume goes with the agent's.
            for container in sorted(found, key=lambda container: not container.name.endswith("-servers")):
                with contextlib.suppress(NotFound):
                    container.remove(force=True, v=True)
            for volume in client.volumes.list(filters=label):  # one left by a removal that failed midway
                with contextlib.suppress(NotFound, APIError):  # in use: a live run's (another folder's label)
                    volume.remove()
        finally:
            client.close()
