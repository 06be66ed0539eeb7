"""A worker's tool services, shared by every prompt it runs: the model calls tools make (vision,
images), the browser (the run's browser service, or one of the worker's own), HTTP clients for pages a
model chooses and for the search provider, and the run's secrets to mask."""

from __future__ import annotations

import functools

import httpx

from trajforge.model.chat import ChatModel
from trajforge.model.settings import ModelSettings
from trajforge.model.tool_model import ToolModel
from trajforge.money.spending import UNMETERED, Spends
from trajforge.secrets import Secrets
from trajforge.tools.browser.client import BrowserClient
from trajforge.tools.browser.guard import GuardProxy
from trajforge.tools.browser.runtime import BrowserLauncher
from trajforge.tools.extraction import Extractor
from trajforge.tools.fetch import http_client
from trajforge.tools.settings import ToolSettings


class ToolServices:
    """Shared by every prompt of one worker process; closed when the worker ends."""

    def __init__(
        self,
        settings: ToolSettings,
        model: ModelSettings,
        secrets: Secrets | None = None,
        spending: Spends = UNMETERED,
        judge: ModelSettings | None = None,
    ):
        self.settings = settings
        # Text that must never reach a trajectory or a log, e.g. the API key a command finds with `ps` or
        # in /proc/<runner>/environ where nothing hides it (`local`), or the ephemeral system prompt.
        self.secrets = secrets or Secrets()
        # For vision and image requests, through the run's cache and budget.
        self.model = ToolModel(model, chat_model=settings.vision_model, spending=spending)
        self._judge, self._spending = judge, spending
        self.browser: BrowserLauncher | BrowserClient
        if settings.browser_endpoint:  # the run's browser service drives the browser for every worker
            self.browser = BrowserClient(settings.browser_endpoint)
        else:
            guard = None if settings.allow_private_urls else GuardProxy(trusted=settings.trusted_origins)
            self.browser = BrowserLauncher(settings.browser_executable, guard)

    @functools.cached_property
    def judge(self) -> ChatModel | None:
        """The judge's endpoint (verification/judge.py), through the run's cache and budget; made on first use."""
        return None if self._judge is None else ChatModel(self._judge, self._spending)

    @functools.cached_property
    def http(self) -> httpx.AsyncClient:
        """For URLs a model chooses (pages, images): public addresses only unless --allow_private_urls;
        made on first use (it costs a third of a second of imports)."""
        return http_client(allow_private=self.settings.allow_private_urls, trusted=self.settings.trusted_origins)

    @functools.cached_property
    def search_http(self) -> httpx.AsyncClient:
        """For the search provider the user configured, which may well run on this machine (SearXNG)."""
        return http_client(allow_private=True)

    @functools.cached_property
    def extractor(self) -> Extractor:
        """web_extract's page texts, in processes of their own (extraction.py), started on first use."""
        return Extractor()

    def redact(self, text: str) -> str:
        """For what is not saved with the prompt (log lines, error messages): masked, not counted."""
        return self.secrets.redact(text)

    async def close(self) -> None:
        await self.browser.close()
        for client in ("http", "search_http"):
            if client in self.__dict__:
                await self.__dict__[client].aclose()
        if "extractor" in self.__dict__:
            await self.__dict__["extractor"].close()
        await self.model.close()
        if self.__dict__.get("judge") is not None:
            await self.__dict__["judge"].close()
