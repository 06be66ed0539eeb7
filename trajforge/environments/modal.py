"""The modal environment: one Modal Sandbox per prompt, from Image.from_registry(image).

Untested against a real Modal account (none on the machine this was written on): built from the
modal SDK's documented Sandbox.create / exec / terminate; its tests cover the options and errors.
The SDK is imported only when this backend is used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
from collections.abc import Mapping
from pathlib import Path

from trajforge.environments import (
    OUTPUT_LIMIT,
    Backend,
    EnvironmentSettings,
    ExecResult,
    container_cwd,
    image_of,
)
from trajforge.environments.contract import timeout_result
from trajforge.environments.shell import KEEP_ALIVE, KILL_ALL, CommandEnvironment
from trajforge.errors import SetupError
from trajforge.tail import CappedOutput

APP_NAME = "batch-runner"
WORKSPACE = "/workspace"
TAG = "batch_runner_run"
# A sandbox ends by itself after this many seconds, so one that a killed run leaves behind stops costing.
SANDBOX_LIFETIME = 4 * 3600
MERGE_STDERR = ["sh", "-c", 'exec "$@" 2>&1', "sh"]  # in order, as on the local backend


def sandbox_options(settings: EnvironmentSettings) -> dict:
    """Sandbox.create keyword arguments besides the app and the image."""
    return {"timeout": SANDBOX_LIFETIME, "block_network": not settings.sandbox_network, "tags": {TAG: settings.run_tag}}


def has_credentials(environ: Mapping[str, str]) -> bool:
    if environ.get("MODAL_TOKEN_ID") and environ.get("MODAL_TOKEN_SECRET"):
        return True
    return Path(environ.get("MODAL_CONFIG_PATH") or Path.home() / ".modal.toml").is_file()


class ModalEnvironment(CommandEnvironment):
    def __init__(self, sandbox, cwd: str, settings: EnvironmentSettings):
        self.sandbox, self.cwd, self.settings = sandbox, cwd, settings

    async def start(self) -> None:
        made = await self.sandbox.exec.aio("mkdir", "-p", "--", self.cwd, timeout=60)
        if await made.wait.aio():
            raise SetupError(f"cannot create cwd {self.cwd!r} in the sandbox: {await made.stderr.read.aio()}")

    async def end_agent_processes(self) -> None:
        await self.run(KILL_ALL, 30)

    async def run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> ExecResult:
        process = await self.sandbox.exec.aio(
            *MERGE_STDERR, *argv, timeout=max(1, math.ceil(timeout)), workdir=self.cwd, text=False
        )
        if stdin is not None:
            process.stdin.write(stdin)
            process.stdin.write_eof()
            await process.stdin.drain.aio()
        output = CappedOutput(limit)
        async for chunk in process.stdout:
            output.feed(chunk)
        code = await process.wait.aio()
        if code == -1:  # what the SDK reports when the exec's timeout ended it
            return timeout_result(output.text(), timeout)
        return ExecResult(output.text(), code)

    async def close(self) -> None:
        from modal.exception import Error

        # If this fails it ends by itself after SANDBOX_LIFETIME; the run's end also removes leftovers by tag.
        with contextlib.suppress(Error):
            await self.sandbox.terminate.aio()


class ModalBackend(Backend):
    def __init__(self, settings: EnvironmentSettings):
        super().__init__(settings)
        self.app = None

    async def environment(self, entry: dict, sample: str = "") -> ModalEnvironment:
        import modal
        from modal.exception import Error

        image = image_of(entry, self.settings)
        try:
            if self.app is None:
                self.app = await modal.App.lookup.aio(APP_NAME, create_if_missing=True)
            sandbox = await modal.Sandbox.create.aio(
                *KEEP_ALIVE, app=self.app, image=modal.Image.from_registry(image), **sandbox_options(self.settings)
            )
        except Error as exc:
            raise SetupError(f"Modal cannot start a sandbox from {image!r}: {exc}") from None
        return ModalEnvironment(sandbox, container_cwd(entry, WORKSPACE), self.settings)

    @classmethod
    def check(cls, settings: EnvironmentSettings) -> None:
        if importlib.util.find_spec("modal") is None:
            raise SetupError("--environment=modal needs the modal package: pip install modal, then modal token new")
        if not has_credentials(os.environ):
            raise SetupError(
                "--environment=modal found no Modal credentials: run `modal token new`, "
                "or set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"
            )

    @classmethod
    def remove_leftovers(cls, settings: EnvironmentSettings) -> None:
        import modal
        from modal.exception import Error

        try:
            for sandbox in modal.Sandbox.list(tags={TAG: settings.run_tag}):
                sandbox.terminate()
        except Error as exc:
            raise SetupError(f"cannot list this run's Modal sandboxes: {exc}") from None
