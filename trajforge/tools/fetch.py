"""One HTTP GET with the limits a tool needs: redirects followed, a deadline for the whole exchange,
a byte cap on the body, and the content type checked before the body is read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

MAX_REDIRECTS = 5
USER_AGENT = "Mozilla/5.0 (compatible; batch-runner/0.1; +web_extract)"


class FetchError(Exception):
    pass


@dataclass(frozen=True)
class Fetched:
    url: str  # after redirects
    status: int
    media_type: str  # "text/html", lower case, without parameters
    charset: str | None
    body: bytes
    truncated: bool  # the body was cut at the byte cap


def http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        follow_redirects=True, max_redirects=MAX_REDIRECTS, headers={"User-Agent": USER_AGENT}, timeout=30.0
    )


def _sniff(first: bytes) -> str:
    """A media type for a body served without one."""
    if b"\0" in first[:1024]:
        return "application/octet-stream"
    return "text/html" if first.lstrip()[:1] == b"<" else "text/plain"


async def fetch(
    client: httpx.AsyncClient, url: str, *, max_bytes: int, timeout: float, accept: Callable[[str], bool]
) -> Fetched:
    """GET `url`; raises FetchError for a bad scheme, an HTTP error status, too many redirects, the
    deadline, a network failure, or a media type that `accept` refuses."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise FetchError(f"only http and https URLs can be fetched, not {url!r}")
    try:
        async with asyncio.timeout(timeout), client.stream("GET", url) as response:
            if response.status_code >= 400:
                raise FetchError(f"HTTP {response.status_code} {response.reason_phrase} from {response.url}")
            media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
            chunks, first = response.aiter_bytes(), b""
            if not media_type:
                first = await anext(chunks, b"")
                media_type = _sniff(first)
            if not accept(media_type):
                raise FetchError(f"{response.url} is {media_type}, which this tool does not read")
            body = bytearray(first)
            async for chunk in chunks:
                if len(body) > max_bytes:
                    break
                body += chunk
            truncated = len(body) > max_bytes
            return Fetched(
                str(response.url),
                response.status_code,
                media_type,
                response.charset_encoding,
                bytes(body[:max_bytes]),
                truncated,
            )
    except TimeoutError:
        raise FetchError(f"{url} did not answer completely within {timeout:g}s") from None
    except httpx.TooManyRedirects:
        raise FetchError(f"{url} redirects more than {MAX_REDIRECTS} times") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"could not fetch {url}: {str(exc) or type(exc).__name__}") from None
