"""The local environment: a fresh temporary workspace per prompt on this machine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

from environments import FILE_LIMIT, CappedOutput, EnvironmentSettings, SetupError


async def run_process(argv: list[str], cwd: str, env: dict, timeout: float) -> dict:
    """Run argv in its own process group; on timeout kill the whole group."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    output = CappedOutput()

    async def drain() -> None:
        while chunk := await proc.stdout.read(65536):
            output.feed(chunk)

    try:
        await asyncio.wait_for(drain(), timeout)
        code = await proc.wait()
        return {"output": output.text(), "exit_code": code, "error": None}
    except TimeoutError:
        return {"output": output.text(), "exit_code": 124, "error": f"command timed out after {timeout:g}s"}
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def command_env(home: str) -> dict:
    """The variables a command sees: nothing of ours (API keys stay out of trajectories)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": home,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONUNBUFFERED": "1",
    }


class LocalEnvironment:
    def __init__(self, cwd: str | None, settings: EnvironmentSettings):
        self.settings = settings
        self.workspace = tempfile.mkdtemp(prefix="batch-runner-")
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
        limit = min(timeout or self.settings.command_timeout, self.settings.command_timeout)
        return await run_process(["sh", "-c", command], self.cwd, self.env, limit)

    async def read_file(self, path: str) -> str:
        target = self.path(path)
        size = target.stat().st_size
        if size > FILE_LIMIT:
            raise ValueError(f"{path} is {size} bytes, more than read_file loads; use terminal with head or grep")
        return target.read_text(errors="replace")

    async def write_file(self, path: str, data: str) -> None:
        target = self.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data)

    async def close(self) -> None:
        if not self.settings.keep_workspaces:
            shutil.rmtree(self.workspace, ignore_errors=True)
