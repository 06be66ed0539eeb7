"""The environment contract, once: what every backend's environments do and how a backend's life goes.

An Environment is one prompt's place to run commands and keep files. A failed command is data (an
ExecResult), never an exception; file operations raise the same error types with the same messages in
every backend, so a tool fails the same way wherever it runs.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from trajforge.environments.settings import EnvironmentSettings


@dataclass(frozen=True)
class ExecResult:
    output: str  # stdout and stderr merged, in order, capped with a visible marker
    exit_code: int  # 124 when the time limit ended the command
    error: str | None = None  # why the command did not finish by itself (the timeout), else None
    timed_out: bool = False


class Writer(Protocol):
    """A spawned process's stdin: asyncio's StreamWriter, or what writes into a container (docker_exec)."""

    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...


class SpawnedProcess(Protocol):
    """A spawned process as its client sees it: asyncio's Process, or one in a container (docker_exec)."""

    @property
    def stdin(self) -> Writer | None: ...
    @property
    def stdout(self) -> asyncio.StreamReader | None: ...
    @property
    def stderr(self) -> asyncio.StreamReader | None: ...
    @property
    def returncode(self) -> int | None: ...


@dataclass(frozen=True)
class Spawned:
    """A long-running process of the sample (a stdio MCP server), started by Environment.spawn."""

    process: SpawnedProcess  # its stdin, stdout and stderr are pipes
    end: Callable[[], Awaitable[None]]  # ends it and every process it started (its process group)


def timeout_result(output: str, timeout: float) -> ExecResult:
    """The result of a command its time limit ended; every backend reports it this way."""
    return ExecResult(output, 124, f"command timed out after {timeout:g}s", True)


def file_missing(path: str) -> FileNotFoundError:
    return FileNotFoundError(f"cannot read {path}: no such file")


def file_is_directory(path: str) -> IsADirectoryError:
    return IsADirectoryError(f"cannot read {path}: it is a directory")


def file_not_regular(path: str) -> OSError:
    return OSError(f"cannot use {path}: not a regular file (a FIFO, device or socket)")


def file_too_big(path: str, size: int) -> ValueError:
    return ValueError(f"{path} is {size} bytes, more than read_file loads; use terminal with head or grep")


class Environment(ABC):
    """One prompt's environment: started once, closed after the prompt, even on error."""

    tests_dir: str | None = None  # where commands find the hidden tests, once add_tests wrote them

    @abstractmethod
    async def start(self) -> None:
        """Make what the environment needs (a workspace, a container); SetupError when it cannot."""

    @abstractmethod
    async def exec(self, command: str, timeout: float | None = None, *, capped: bool = True) -> ExecResult:
        """Run `command` with sh -c in the working directory, within min(timeout, --command_timeout)
        (within `timeout` alone when not `capped`: the runner's own commands, such as verification, have
        their own limit); at the limit every process the command started is killed."""

    @abstractmethod
    async def read_file(self, path: str) -> str:
        """The text of a file (relative paths from the working directory). Raises FileNotFoundError,
        IsADirectoryError, ValueError (too big to load) or OSError (not a regular file, any other reason)."""

    @abstractmethod
    async def write_file(self, path: str, data: str | bytes) -> None:
        """Create or overwrite a regular file (parent directories are created); OSError when it cannot
        (a FIFO, device or socket is refused, never opened)."""

    async def write_files(self, files: dict[str, bytes]) -> None:
        """Write many files at once (a task's workspace): what write_file does for each."""
        for path, data in files.items():
            await self.write_file(path, data)

    async def spawn(
        self, argv: list[str], variables: dict[str, str], read_only: tuple[str, ...] = (), limit: int = 1 << 16
    ) -> Spawned:
        """Start `argv` in the sample's sandbox and leave it running, its stdin, stdout and stderr pipes
        (`limit`: the longest line its stdout reader takes), its working folder the sample's: a process
        of the sample like its commands (its limits, uid, network policy), ended with them at the latest.
        `variables` are added to a command's; `read_only` host paths are readable at the same path."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot start a server in the sample (a stdio MCP server); "
            "use local, bwrap or docker"
        )

    async def verification_ahead(self, verified: bool) -> None:
        """The environment is open and nothing of the task is in it yet: whether the sample will be `verified`.
        A backend that bounds the sample's disk keeps the verification's room aside now, before the task's
        setup or the agent could fill the disk (a setup that fills it on purpose, for the agent to free, is
        a task like any other), and none for a sample nobody verifies."""
        return

    async def agent_begins(self, verified: bool) -> None:
        """The task is in place (its files, its setup): what changes in the workspace from now on is the
        agent's. A backend that reads a file's ctime on the clock it can read notes the moment (the clean
        room then checks only the git object files changed since); the others check every one. For a
        sample that will be `verified` (a clean room will look at its workspace), a backend of commands
        records the hash of every git pack file too (the clean room need not verify again a pack that git
        merely freshened); an unverified sample runs no command for it."""
        return  # nothing noted: every git object file is checked

    async def add_tests(self, files: dict[str, bytes]) -> None:
        """After the agent's last turn: end every process it left, then write `files` (relative paths) into
        a fresh directory it could never reach, set tests_dir and TESTS_DIR for the commands that follow."""
        raise NotImplementedError(f"{type(self).__name__} cannot hold hidden tests; use local, bwrap or docker")

    async def put_folder(self, path: str, files: dict[str, bytes]) -> None:
        """Make `path` (absolute) a folder holding only `files` (relative paths): a task folder's /tests,
        /solution and /logs/verifier."""
        raise NotImplementedError(f"{type(self).__name__} cannot hold a task folder's files; use docker")

    async def fresh_copy(self) -> Environment:
        """A new, started environment of the same image and limits holding only this one's working
        directory: where a task folder's tests run, out of reach of whatever else the agent changed."""
        raise NotImplementedError(f"{type(self).__name__} cannot verify a task folder; use docker")

    async def verification_room(self) -> Environment:
        """Where the sample's verification runs (its clean room, hidden tests and checks): this environment,
        or where the backend makes one, a fresh_copy of it, which the caller closes."""
        return self

    async def remove_escapes(self) -> str:
        """Remove from the working directory symlinks resolving outside it, FIFOs, sockets and devices
        (and neutralise its git repositories' drivers); returns the note enter_clean_room returns."""
        raise NotImplementedError(f"{type(self).__name__} cannot clean a workspace")

    @abstractmethod
    async def enter_clean_room(self) -> str:
        """Before verification: end every process the agent started, remove from the workspace symlinks
        resolving outside it, FIFOs, sockets and devices, and from now on run every command in the clean
        room (a fresh HOME, PYTHONNOUSERSITE=1, PYTHONSAFEPATH=1, the system PATH, the command on stdin).
        Returns a note naming what was removed ("" when nothing was), for verification.output."""

    @abstractmethod
    async def close(self) -> None:
        """Remove what start() made (unless --keep_workspaces keeps the files); never raises for
        something already gone."""


class Backend(ABC):
    """Opens the environments of one worker process and holds what its prompts share (a client, the
    images already checked). Its life, named the same in every backend:

    - check(settings): can this backend work on this machine? (the parent, once, before any request)
    - prepare_run(settings, resume): per run, before the workers start
    - open(entry): per prompt, in a worker: a started environment
    - remove_leftovers(settings): what a killed run of the same folder left behind
    """

    # Who enforces --max_processes, --max_memory_mb and --max_file_size_mb (limits.unenforced says what is
    # not, once at start): RUNNER, each command's exec chain (a cgroup where one can be made, RLIMIT_FSIZE);
    # OWN, the backend itself (a container's limits); NONE, nobody.
    LIMITS: ClassVar[str] = "none"

    def __init__(self, settings: EnvironmentSettings):
        self.settings = settings

    @classmethod
    @abstractmethod
    def check(cls, settings: EnvironmentSettings) -> None:
        """Raise SetupError, saying how to fix it, when this backend cannot work on this machine."""

    @classmethod
    def prepare_run(cls, settings: EnvironmentSettings, resume: bool) -> None:
        """Fail fast when the backend cannot work here; on --resume remove a killed run's leftovers."""
        cls.check(settings)
        if resume:
            cls.remove_leftovers(settings)

    @classmethod
    @abstractmethod
    def remove_leftovers(cls, settings: EnvironmentSettings) -> None:
        """Remove what a killed run of settings.run_dir left behind (workspaces, containers, sandboxes)."""

    @abstractmethod
    async def environment(self, entry: dict, sample: str = "") -> Environment:
        """A new, not yet started environment for one dataset entry; `sample` names the sample, the same
        on every invocation, so a workspace path the model sees can be the same on a re-run."""

    async def open(self, entry: dict, sample: str = "") -> Environment:
        """A started environment for one dataset entry; SetupError fails only that prompt. Closed again
        when starting fails or is cancelled, so a half-made container never outlives its prompt."""
        env = await self.environment(entry, sample)
        try:
            await env.start()
        except BaseException:
            await env.close()
            raise
        return env
