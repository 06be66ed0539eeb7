"""A plain JSON POST to the endpoint straight on the openai client's own aiohttp session: the same
request bytes, headers, URL, timeouts, size cap, cookies and exceptions as `AsyncOpenAI.post`, without
its per-request cost (request options copied and validated, headers merged, URL and cookies parsed, an
httpx request and response wrapped around aiohttp's: more CPU than the send itself).

What openai would send is read from openai once per path (`_build_request`, the headers of its
first request: auth, OpenAI-Organization, X-Stainless-*, Accept-Encoding), and its failures are
raised as openai raises them: a status error made by openai itself from the reply
(`_make_status_error_from_response`: the same type, message, body and headers), and
APITimeoutError/APIConnectionError from the same httpx exception httpx_aiohttp maps aiohttp's to.
Whatever this path does not reproduce goes through openai as before (`through_openai`): a proxy
from the environment, cookies the server set (httpx keeps them), openai's or httpx's request log
switched on, a redirect (sent again through openai, which follows it). It reads openai's and httpx's
private parts (`_build_request`, `_make_status_error_from_response`, `_client`, `_transport_for_url`):
tests/test_lean_post.py compares both paths byte for byte, so an upgrade that moves them fails there."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

import aiohttp
import httpx
import openai
import yarl
from httpx_aiohttp.transport import AiohttpResponseStream, AiohttpTransport, map_aiohttp_exceptions
from openai._models import FinalRequestOptions
from openai._utils._json import openapi_dumps

from trajforge.model.reply_size import MAX_REPLY_BYTES, TooLarge, refusal

CHUNK = AiohttpResponseStream.CHUNK_SIZE  # as httpx_aiohttp reads a body
REDIRECTS = (301, 302, 303, 307, 308)  # httpx follows these when they name a Location
BODY_HEADERS = ("content-length", "transfer-encoding")  # of the body at hand, set for each
LOGS = (logging.getLogger("openai"), logging.getLogger("httpx"))


class ThroughOpenAI(Exception):
    """This request is openai's to send (see the module's doc)."""


@dataclass(frozen=True)
class Route:
    """What openai sends for one path, read once."""

    url: yarl.URL
    headers: dict[str, str]  # in openai's order, lower case as httpx hands them to aiohttp
    timeout: aiohttp.ClientTimeout
    sni: str | None  # httpx_aiohttp's server_hostname (a host with `_`)
    plain: bool  # no proxy mounted for the URL: httpx would use its default transport


class LeanPost:
    def __init__(self, client: openai.AsyncOpenAI, limit: int = MAX_REPLY_BYTES):
        self.client = client
        self.http = client._client  # the DefaultAioHttpClient (httpx over aiohttp) openai sends through
        self.limit = limit
        self._routes: dict[str, Route] = {}

    async def __call__(self, path: str, body: dict) -> bytes:
        """The reply body of POST `body` to `path`, as openai's post with cast_to=httpx.Response would have
        returned it; ThroughOpenAI when openai must send it."""
        route = self._routes.get(path) or await self._route(path)
        if not route.plain or self.http.cookies or any(log.isEnabledFor(logging.INFO) for log in LOGS):
            raise ThroughOpenAI
        data = openapi_dumps(body)
        try:
            with map_aiohttp_exceptions():
                async with self._session().request(
                    "POST",
                    route.url,
                    headers=route.headers | {"content-length": str(len(data))},  # as httpx names it
                    data=data,
                    allow_redirects=False,
                    auto_decompress=False,
                    compress=False,
                    timeout=route.timeout,
                    server_hostname=route.sni,
                ) as response:
                    return await self._read(route, data, response)
        except httpx.TimeoutException as exc:
            raise openai.APITimeoutError(request=self._request(route, data)) from exc
        except (openai.OpenAIError, ThroughOpenAI):
            raise
        except Exception as exc:  # our size check's BadReply too, as openai wraps it (ModelClient unwraps it)
            raise openai.APIConnectionError(request=self._request(route, data)) from exc

    async def _read(self, route: Route, data: bytes, response: aiohttp.ClientResponse) -> bytes:
        """The body of a reply whose head came: the size cap, openai's status errors, httpx's cookies."""
        headers = response.headers
        if "set-cookie" in headers:  # kept as httpx keeps them; the next requests go through openai
            self.http.cookies.extract_cookies(self._response(route, data, response, b""))
        encoding, length = joined(headers, "content-encoding", "identity"), joined(headers, "content-length", "")
        refused = refusal(encoding, length, self.limit)
        if refused is not None:
            raise refused
        status = response.status
        if status in REDIRECTS and "location" in headers:
            raise ThroughOpenAI
        size, chunks = 0, []
        async for chunk in response.content.iter_chunked(CHUNK):
            size += len(chunk)
            if size > self.limit:
                raise TooLarge(self.limit)
            chunks.append(chunk)
        content = b"".join(chunks)
        if not 200 <= status < 300:
            raise self.client._make_status_error_from_response(self._response(route, data, response, content)) from None
        return content

    async def _route(self, path: str) -> Route:
        """What openai would send to `path`: its own first request, built and not sent."""
        client = self.client
        if client._platform is None:  # as openai's request() reads it first (blocking I/O: off the loop)
            client._platform = await openai._utils.asyncify(openai._base_client.get_platform)()
        request = client._build_request(FinalRequestOptions.construct(method="post", url=path, json_data={}))
        extensions = request.extensions
        timeout = extensions.get("timeout", {})
        route = Route(
            url=yarl.URL(str(request.url)),
            headers={name: value for name, value in request.headers.items() if name not in BODY_HEADERS},
            timeout=aiohttp.ClientTimeout(
                sock_connect=timeout.get("connect"), sock_read=timeout.get("read"), connect=timeout.get("pool")
            ),
            sni=extensions.get("sni_hostname"),
            plain=self.http._transport_for_url(request.url) is self.http._transport,
        )
        self._routes[path] = route
        return route

    def _session(self) -> aiohttp.ClientSession:
        """The aiohttp session of httpx_aiohttp's transport, made as its first request would make it: one
        connection pool for both paths, closed with the client."""
        transport = cast(AiohttpTransport, self.http._transport)
        if not isinstance(transport.client, aiohttp.ClientSession):
            transport.client = transport.get_client()
        return transport.client

    def _request(self, route: Route, data: bytes) -> httpx.Request:
        """The httpx request openai's exceptions carry (only made for one)."""
        return httpx.Request("POST", str(route.url), headers=route.headers, content=data)

    def _response(self, route: Route, data: bytes, response: aiohttp.ClientResponse, content: bytes) -> httpx.Response:
        """The httpx response openai's status errors and httpx's cookie jar read (only made for them)."""
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            content=content,
            request=self._request(route, data),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode()},
        )


def joined(headers, name: str, default: str) -> str:
    """A header as httpx reads it: its values joined by ", ", or `default` when it has none."""
    values = headers.getall(name, ())
    return ", ".join(values) if values else default
