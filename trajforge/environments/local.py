"""The local environment: a fresh temporary workspace per prompt on this machine."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import signal
import tempfile
from pathlib import Path

from trajforge.environments import (
    FILE_LIMIT,
    OUTPUT_LIMIT,
    Backend,
    CappedOutput,
    EnvironmentSettings,
    SetupError,
    file_too_big,
)

# What every command sees besides PATH and HOME; nothing of ours (API keys stay out of trajectories).
COMMAND_VARIABLES = {"LANG": "C.UTF-8", "TERM": "dumb", "PYTHONUNBUFFERED": "1"}


async def run_process(
    argv: list[str], cwd: str, env: dict, timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
) -> dict:
    """Run argv in its own process group, feeding it `stdin`; on timeout kill the whole group."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    output = CappedOutput(limit)

    async def feed() -> None:
        if stdin is not None:
            proc.stdin.write(stdin)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it may not read it all
                await proc.stdin.drain()
            proc.stdin.close()

    async def drain() -> None:
        while chunk := await proc.stdout.read(65536):
            output.feed(chunk)

    try:
        await asyncio.wait_for(asyncio.gather(feed(), drain()), timeout)
        code = await proc.wait()
        return {"output": output.text(), "exit_code": code, "error": None}
    except TimeoutError:
        return {"output": output.text(), "exit_code": 124, "error": f"command timed out after {timeout:g}s"}
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def workspace_prefix(settings: EnvironmentSettings) -> str:
    """Temporary folders of one run start with this, so a later run can remove what a killed one left."""
    return f"batch-runner-{settings.run_tag}-"


def make_workspace(settings: EnvironmentSettings, kind: str = "") -> str:
    return tempfile.mkdtemp(prefix=workspace_prefix(settings) + kind)


def command_env(home: str) -> dict:
    """The variables a command on this machine sees."""
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": home, **COMMAND_VARIABLES}


class LocalEnvironment:
    def __init__(self, cwd: str | None, settings: EnvironmentSettings):
        self.settings = settings
        self.workspace = make_workspace(settings)
        self.cwd = self.workspace
        if cwd and os.path.isabs(cwd):
            if not os.path.isdir(cwd):
                shutil.rmtree(self.workspace, ignore_errors=True)
                raise SetupError(f"cwd {cwd!r} does not exist on this machine (local environment)")
            self.cwd = cwd
        elif cwd:
            self.cwd = os.path.join(self.workspace, cwd)
            os.makedirs(self.cwd, exist_ok=True)
        self.env = command_env(self.workspace)

    def path(self, path: str) -> Path:
        return Path(self.cwd, path)

    async def execute(self, command: str, timeout: float | None = None) -> dict:
        return await run_process(["sh", "-c", command], self.cwd, self.env, self.settings.limit(timeout))

    async def read_file(self, path: str) -> str:
        target = self.path(path)
        size = target.stat().st_size
        if size > FILE_LIMIT:
            raise file_too_big(path, size)
        return target.read_text(errors="replace")

    async def write_file(self, path: str, data: str) -> None:
        target = self.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data)

    async def close(self) -> None:
        if not self.settings.keep_workspaces:
            shutil.rmtree(self.workspace, ignore_errors=True)


class LocalBackend(Backend):
    async def open(self, entry: dict) -> LocalEnvironment:
        return LocalEnvironment(entry.get("cwd"), self.settings)

    @classmethod
    def remove_leftovers(cls, settings: EnvironmentSettings) -> None:
        if not settings.keep_workspaces:
            for path in glob.glob(os.path.join(tempfile.gettempdir(), glob.escape(workspace_prefix(settings)) + "*")):
                shutil.rmtree(path, ignore_errors=True)
