"""What a tool call can reach besides its arguments.

The worker hands the agent loop one ToolSession per prompt; every tool gets it as its first argument.
It holds the prompt's environment (`session.env`, with the run's secrets redacted from what comes out of
it), the worker's shared services, per-prompt resources (the browser context, opened on first use and
closed with the prompt) and a usage counter for the model calls tools make (vision, images), which the
worker adds to the prompt's usage.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from trajforge.environments import Environment
from trajforge.environments.redacted import Redacted
from trajforge.model.client import ModelSettings
from trajforge.model.tool_model import ToolModel
from trajforge.model.usage import add_usage, empty_usage
from trajforge.money.spending import Spending
from trajforge.secrets import Secrets
from trajforge.tools.browser_client import BrowserClient
from trajforge.tools.browser_guard import GuardProxy
from trajforge.tools.browser_runtime import BrowserLauncher
from trajforge.tools.fetch import http_client
from trajforge.tools.settings import ToolSettings


class ToolServices:
    """Shared by every prompt of one worker process; closed when the worker ends."""

    def __init__(
        self,
        settings: ToolSettings,
        model: ModelSettings,
        secrets: Secrets | None = None,
        spending: Spending | None = None,
    ):
        self.settings = settings
        # Text that must never reach a trajectory or a log, e.g. the API key a command finds with `ps` or
        # in /proc/<runner>/environ where nothing hides it (`local`), or the ephemeral system prompt.
        self.secrets = secrets or Secrets()
        # For vision and image requests, through the run's cache and budget.
        self.model = ToolModel(model, chat_model=settings.vision_model, spending=spending)
        self.browser: BrowserLauncher | BrowserClient
        if settings.browser_endpoint:  # the run's browser service drives the browser for every worker
            self.browser = BrowserClient(settings.browser_endpoint)
        else:
            guard = None if settings.allow_private_urls else GuardProxy(trusted=settings.trusted_origins)
            self.browser = BrowserLauncher(settings.browser_executable, guard)

    @functools.cached_property
    def http(self) -> httpx.AsyncClient:
        """For URLs a model chooses (pages, images): public addresses only unless --allow_private_urls;
        made on first use (it costs a third of a second of imports)."""
        return http_client(allow_private=self.settings.allow_private_urls, trusted=self.settings.trusted_origins)

    @functools.cached_property
    def search_http(self) -> httpx.AsyncClient:
        """For the search provider the user configured, which may well run on this machine (SearXNG)."""
        return http_client(allow_private=True)

    def redact(self, text: str) -> str:
        """For what is not saved with the prompt (log lines, error messages): masked, not counted."""
        return self.secrets.redact(text)

    async def close(self) -> None:
        await self.browser.close()
        for client in ("http", "search_http"):
            if client in self.__dict__:
                await self.__dict__[client].aclose()
        await self.model.close()


class Resources:
    """A prompt's resources, each opened on first use and closed with the prompt."""

    def __init__(self):
        self._resources: dict[str, Any] = {}

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

    async def release_all(self) -> None:
        for name in list(self._resources):
            with contextlib.suppress(Exception):
                await self.release(name)


class ToolSession(Resources):
    def __init__(self, env: Environment, services: ToolServices, scope: str = ""):
        super().__init__()
        self.services = services
        self.scope = scope  # the sample the tools' model calls belong to (the response cache's key)
        self.redactions: Counter = Counter()  # secrets masked in what this prompt saves, by kind
        self.env: Environment = Redacted(env, self.redact)
        self.usage = empty_usage()

    def redact(self, text: str) -> str:
        return self.services.secrets.redact(text, self.redactions)

    def count_usage(self, usage: dict) -> None:
        add_usage(self.usage, usage)

    async def close(self) -> None:
        """Resources first (a browser context must not outlive its prompt), then the environment."""
        try:
            await self.release_all()
        finally:
            await self.env.close()
