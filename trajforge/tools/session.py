"""What a tool call can reach besides its arguments.

The worker hands the agent loop one ToolSession per prompt; every tool gets it as its first argument.
It holds the prompt's environment (`session.env`, with the run's secrets redacted from what comes out of
it), the worker's shared services (tools/services.py), per-prompt resources (the browser context, opened
on first use and closed with the prompt) and a usage counter for the model calls tools make (vision,
images), which the worker adds to the prompt's usage.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from trajforge.caller import NOBODY, Caller
from trajforge.environments import Environment
from trajforge.environments.redacted import Redacted
from trajforge.model.usage import add_usage, empty_usage
from trajforge.secrets import Secrets
from trajforge.tools import Tool

if TYPE_CHECKING:  # the services hold the model client, whose imports the browser service does without
    from trajforge.model.chat import ChatModel
    from trajforge.tools.services import ToolServices


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
    def __init__(
        self, env: Environment, services: ToolServices | None, caller: Caller = NOBODY, secrets: Secrets | None = None
    ):
        """`services` None: a sample that calls no tool (--check_tasks); `secrets` defaults to the services';
        `caller`: who the sample's model calls (its agent's, its tools', its judge's) are made for."""
        super().__init__()
        self._services = services
        self.secrets = secrets or (services.secrets if services else Secrets())
        self.caller = caller
        self.redactions: Counter = Counter()  # secrets masked in what this prompt saves, by kind
        self.env: Environment = Redacted(env, self.redact)
        self.usage = empty_usage()
        self.listed: dict[str, list[Tool]] = {}  # toolset -> what it listed for this sample (an MCP server's)

    @property
    def scope(self) -> str:
        """The sample the model calls belong to (the response cache's key)."""
        return self.caller.scope

    @property
    def services(self) -> ToolServices:
        if self._services is None:
            raise RuntimeError("this sample was offered no tools, so it has no tool services")
        return self._services

    @property
    def judge(self) -> ChatModel | None:
        """The judge's endpoint; None where nothing may call one (--check_tasks)."""
        return self._services.judge if self._services is not None else None

    def offered(self, tools: dict[str, Tool]) -> dict[str, Tool]:
        """`tools`, each toolset that listed its tools for this sample offering what it listed in their place."""
        offered: dict[str, Tool] = {}
        for tool in tools.values():
            if tool.toolset in self.listed:
                offered.update((each.name, each) for each in self.listed[tool.toolset])
            else:
                offered[tool.name] = tool
        return offered

    def redact(self, text: str) -> str:
        return self.secrets.redact(text, self.redactions)

    def count_usage(self, usage: dict) -> None:
        add_usage(self.usage, usage)

    def take_usage(self) -> dict:
        """What the model calls of tools (and verification) used since the last take, counted from zero again."""
        usage, self.usage = self.usage, empty_usage()
        return usage

    async def close(self) -> None:
        """Resources first (a browser context must not outlive its prompt), then the environment."""
        try:
            await self.release_all()
        finally:
            await self.env.close()
