"""The providers behind web_search, chosen by environment variables: a SearXNG instance (its JSON API)
or a hosted API (Tavily, Brave). Each answers a list of {title, url, snippet}; an answer is read decoded
up to a cap (decoded.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by search(): the tools settings import this module at batch_runner.py's start
    import httpx

from trajforge.tools.decoded import Undecodable, read_decoded

TAVILY_ENDPOINT = "https://api.tavily.com/search"
BRAVE_ENDPOINT = "https://api.search.brave.com/res/v1/web/search"
HOW_TO_CONFIGURE = "set WEB_SEARCH_URL to a SearXNG instance, or TAVILY_API_KEY or BRAVE_API_KEY"


@dataclass(frozen=True)
class SearchProvider:
    name: str  # searxng | tavily | brave
    endpoint: str
    api_key: str | None = field(default=None, repr=False)


class SearchError(Exception):
    pass


def search_provider(environ: Mapping[str, str]) -> SearchProvider | None:
    """The first configured of: WEB_SEARCH_URL (SearXNG), TAVILY_API_KEY, BRAVE_API_KEY."""
    if environ.get("WEB_SEARCH_URL"):
        base = environ["WEB_SEARCH_URL"].rstrip("/")
        return SearchProvider("searxng", base if base.endswith("/search") else base + "/search")
    if environ.get("TAVILY_API_KEY"):
        return SearchProvider("tavily", TAVILY_ENDPOINT, environ["TAVILY_API_KEY"])
    if environ.get("BRAVE_API_KEY"):
        return SearchProvider("brave", BRAVE_ENDPOINT, environ["BRAVE_API_KEY"])
    return None


async def _answer(http: httpx.AsyncClient, provider: SearchProvider, limit: int, method: str, **request):
    """The provider's JSON answer to one request, its body read decoded up to `limit` bytes."""
    try:
        async with http.stream(method, provider.endpoint, **request) as response:
            body, more = await read_decoded(response, limit)
    except Undecodable as exc:
        raise SearchError(f"{provider.name}: {exc}") from None
    if more:
        raise SearchError(f"{provider.name} answered more than {limit} bytes: not read")
    text = body.decode("utf-8", errors="replace")
    if response.status_code >= 400:
        hint = ""
        if provider.name == "searxng" and response.status_code == 403:
            hint = "; enable the json format in its settings.yml (search: formats: [html, json])"
        raise SearchError(f"{provider.name} answered HTTP {response.status_code}: {text[:200]}{hint}")
    try:
        return json.loads(body)
    except ValueError:
        raise SearchError(f"{provider.name} did not answer JSON: {text[:200]}") from None


def _result(title, url, snippet) -> dict:
    return {"title": title or "", "url": url or "", "snippet": snippet or ""}


async def _searxng(http: httpx.AsyncClient, provider: SearchProvider, query: str, limit: int, size: int) -> list[dict]:
    data = await _answer(http, provider, size, "GET", params={"q": query, "format": "json"})
    return [_result(r.get("title"), r.get("url"), r.get("content")) for r in data.get("results") or []]


async def _tavily(http: httpx.AsyncClient, provider: SearchProvider, query: str, limit: int, size: int) -> list[dict]:
    data = await _answer(
        http,
        provider,
        size,
        "POST",
        json={"query": query, "max_results": limit},
        headers={"Authorization": f"Bearer {provider.api_key}"},
    )
    return [_result(r.get("title"), r.get("url"), r.get("content")) for r in data.get("results") or []]


async def _brave(http: httpx.AsyncClient, provider: SearchProvider, query: str, limit: int, size: int) -> list[dict]:
    data = await _answer(
        http,
        provider,
        size,
        "GET",
        params={"q": query, "count": limit},
        headers={"X-Subscription-Token": provider.api_key or "", "Accept": "application/json"},
    )
    return [
        _result(r.get("title"), r.get("url"), r.get("description"))
        for r in (data.get("web") or {}).get("results") or []
    ]


SEARCHES: dict[str, Callable[..., Awaitable[list[dict]]]] = {"searxng": _searxng, "tavily": _tavily, "brave": _brave}


async def search(
    http: httpx.AsyncClient, provider: SearchProvider, query: str, limit: int, timeout: float, max_bytes: int
) -> list[dict]:
    """Up to `limit` results from an answer of at most `max_bytes` decoded bytes; every failure is a
    SearchError that says what went wrong."""
    import httpx

    try:
        async with asyncio.timeout(timeout):
            results = await SEARCHES[provider.name](http, provider, query, limit, max_bytes)
    except TimeoutError:
        raise SearchError(f"no answer from {provider.name} within {timeout:g}s") from None
    except httpx.HTTPError as exc:
        problem = str(exc) or type(exc).__name__
        raise SearchError(f"could not reach {provider.name} at {provider.endpoint}: {problem}") from None
    return results[:limit]
