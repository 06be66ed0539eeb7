"""The web toolset: web_extract reads pages, web_search asks the configured search provider.

web_extract needs nothing but the network, so the toolset stays available without a search provider;
only web_search is then left out (one warning at start).
"""

from __future__ import annotations

import asyncio

from trajforge.tools.extraction import ExtractionError
from trajforge.tools.fetch import FetchError, fetch
from trajforge.tools.search_providers import HOW_TO_CONFIGURE, search
from trajforge.tools.session import ToolSession
from trajforge.tools.settings import ToolSettings

MAX_URLS = 5
TEXT_LIMIT = 20_000  # characters of text returned per page
HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/x-ndjson")


def search_configured(settings: ToolSettings) -> dict[str, str]:
    return {} if settings.search else {"web_search": f"no search provider configured: {HOW_TO_CONFIGURE}"}


def _readable(media_type: str) -> bool:
    return media_type in HTML_TYPES or media_type.startswith("text/") or media_type in TEXT_TYPES


def _decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")


async def _extract(session: ToolSession, url: str) -> dict:
    settings = session.services.settings
    try:
        page = await fetch(
            session.services.http,
            url,
            max_bytes=settings.fetch_max_bytes,
            timeout=settings.fetch_timeout,
            accept=_readable,
        )
    except FetchError as exc:
        return {"url": url, "error": str(exc)}
    if page.media_type in HTML_TYPES:
        # In the worker's extraction process, stopped at the deadline: some pages take trafilatura minutes.
        try:
            title, text = await session.services.extractor.text(page.body, page.url, settings.fetch_timeout)
        except ExtractionError as exc:
            return {"url": url, "error": f"{page.url}: {exc}"}
    else:
        title, text = None, _decode(page.body, page.charset)
    notes = []
    if page.truncated:
        notes.append(f"the page is larger than {settings.fetch_max_bytes} bytes; only its start was read")
    if len(text) > TEXT_LIMIT:
        notes.append(f"{len(text) - TEXT_LIMIT} more characters of text cut")
        text = text[:TEXT_LIMIT]
    if notes:
        text += f"\n[... {'; '.join(notes)} ...]"
    return {"url": url, "final_url": page.url, "title": title, "content": text, "truncated": bool(notes)}


async def web_extract(session: ToolSession, urls: list[str]) -> dict:
    """Fetch web pages and return their readable text: the main content of HTML pages, plain text,
    JSON and XML as they are. Long pages are cut with a marker.

    Args:
        urls: up to 5 http or https addresses
    """
    if isinstance(urls, str):  # models often send one URL bare
        urls = [urls]
    if not urls or len(urls) > MAX_URLS:
        return {"error": f"give between 1 and {MAX_URLS} URLs"}
    results = await asyncio.gather(*(_extract(session, url) for url in urls))
    if all("error" in result for result in results):
        return {"error": "; ".join(result["error"] for result in results), "results": results}
    return {"results": results}


async def web_search(session: ToolSession, query: str, limit: int = 5) -> dict:
    """Search the web; returns titles, URLs and snippets. Read a result in full with web_extract.

    Args:
        query: what to search for
        limit: how many results to return, 1 to 10
    """
    services = session.services
    provider = services.settings.search
    if provider is None:
        return {"error": f"web search is not configured: {HOW_TO_CONFIGURE}"}
    limit = min(max(int(limit), 1), 10)
    settings = services.settings
    results = await search(
        services.search_http, provider, query, limit, settings.fetch_timeout, settings.fetch_max_bytes
    )
    return {"query": query, "provider": provider.name, "results": results}
