"""What a tool call can reach besides its arguments.

The worker hands the agent loop one ToolSession per prompt in place of the bare environment. Its four
environment coroutines pass straight through, so the terminal and file tools see a plain environment;
tools that need more find the worker's shared services, per-prompt resources (the browser context,
opened on first use and closed with the prompt) and a usage counter for the model calls they make
(vision, images), which the worker adds to the prompt's usage.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import httpx

from trajforge.environments import Environment
from trajforge.model.client import ModelClient, ModelSettings, add_usage, empty_usage
from trajforge.tools.browser_runtime import BrowserLauncher
from trajforge.tools.fetch import http_client
from trajforge.tools.settings import ToolSettings


class ToolServices:
    """Shared by every prompt of one worker process; closed when the worker ends."""

    def __init__(self, settings: ToolSettings, model: ModelSettings, secrets: tuple[str, ...] = ()):
        self.settings = settings
        # Text that must never reach a trajectory, e.g. the API key a command finds with `ps` or in
        # /proc/<runner>/environ, or an ephemeral system prompt passed on the command line.
        self.secrets = tuple(secret for secret in secrets if len(secret) >= 8)
        # Vision and image requests go to the run's endpoint under the same retry policy, never streamed.
        self.model = ModelClient(replace(model, model=settings.vision_model, stream=False))
        self.browser = BrowserLauncher(settings.browser_executable, settings.browser_endpoint)

    @functools.cached_property
    def http(self) -> httpx.AsyncClient:
        """For web pages and images; made on first use (it costs a third of a second of imports)."""
        return http_client()

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        return text

    async def close(self) -> None:
        await self.browser.close()
        if "http" in self.__dict__:
            await self.http.aclose()
        await self.model.close()


class ToolSession:
    def __init__(self, env: Environment, services: ToolServices):
        self.env = env
        self.services = services
        self.usage = empty_usage()
        self._resources: dict[str, Any] = {}

    async def execute(self, command: str, timeout: float | None = None) -> dict:
        result = await self.env.execute(command, timeout)
        return {**result, "output": self.services.redact(result["output"])}

    async def read_file(self, path: str) -> str:
        return self.services.redact(await self.env.read_file(path))

    async def write_file(self, path: str, data: str) -> None:
        await self.env.write_file(path, data)

    def count_usage(self, usage: dict) -> None:
        add_usage(self.usage, usage)

    async def resource(self, name: str, open_it: Callable[[], Awaitable[Any]]) -> Any:
        """The prompt's resource `name` (anything with an async close()), opened on first use."""
        if name not in self._resources:
            self._resources[name] = await open_it()
        return self._resources[name]

    async def release(self, name: str) -> bool:
        """Close the resource `name` now; False if it was not open."""
        resource = self._resources.pop(name, None)
        if resource is None:
            return False
        await resource.close()
        return True

    async def close(self) -> None:
        """Resources first (a browser context must not outlive its prompt), then the environment."""
        try:
            for name in list(self._resources):
                with contextlib.suppress(Exception):
                    await self.release(name)
        finally:
            await self.env.close()
