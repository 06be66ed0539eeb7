"""One HTTP GET with the limits a tool needs: redirects followed, a deadline for the whole exchange,
a cap on the decoded bytes of the body, enforced as it is decoded (decoded.py), the content type checked
before the body is read, and (unless private addresses are allowed) only public addresses reached, at
every redirect hop (netguard.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore
import httpx

from trajforge.tls import tls_context
from trajforge.tools.decoded import ACCEPTED, Undecodable, decoded
from trajforge.tools.netguard import Blocked, Resolver, reachable_addresses, system_resolver

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
    truncated: bool  # the decoded body was cut at the byte cap


LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)  # httpx's defaults


class GuardedNetwork(httpcore.AsyncNetworkBackend):
    """Opens connections only to addresses netguard checked: the name is resolved once, here, and the
    socket opened to one of those very addresses (no second lookup a DNS rebinding could answer), while
    TLS (SNI and the certificate check) and the Host header keep the name, since httpcore sets them from
    the URL. A connection is made per origin, so every redirect hop to a new host is checked again."""

    def __init__(
        self,
        resolver: Resolver = system_resolver,
        network: httpcore.AsyncNetworkBackend | None = None,
        trusted: frozenset[str] = frozenset(),
    ):
        self.resolver = resolver
        self.network = network or httpcore.AnyIOBackend()
        self.trusted = trusted  # host:port let through unchecked: the mock model's own server

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await reachable_addresses(host, port, self.resolver, self.trusted)
        except OSError as exc:  # the name does not resolve: a connection error, as it is without the guard
            raise httpcore.ConnectError(str(exc)) from exc
        failure = httpcore.ConnectError(f"{host} resolves to no address")
        for address in addresses:
            try:
                return await self.network.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except httpcore.ConnectError as exc:  # e.g. an IPv6 address and no IPv6 route: the next one
                failure = exc
        raise failure

    async def sleep(self, seconds: float) -> None:
        await self.network.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, network: GuardedNetwork):
        super().__init__(limits=LIMITS, verify=tls_context())
        # httpx 0.28 takes no network backend (encode/httpx#3749 would add one): the connection pool it
        # made is replaced by the same pool connecting through `network`.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=tls_context(),
            max_connections=LIMITS.max_connections,
            max_keepalive_connections=LIMITS.max_keepalive_connections,
            keepalive_expiry=LIMITS.keepalive_expiry,
            network_backend=network,
        )


def http_client(
    allow_private: bool = False, network: GuardedNetwork | None = None, trusted: frozenset[str] = frozenset()
) -> httpx.AsyncClient:
    """A client for the tools. Without `allow_private` (the one for URLs a model chooses) every connection
    goes through `network`, a GuardedNetwork on the system resolver by default; proxy variables of the
    environment are then not used, since a proxy would resolve the name again itself, past the check."""
    return httpx.AsyncClient(
        transport=None if allow_private else GuardedTransport(network or GuardedNetwork(trusted=trusted)),
        follow_redirects=True,
        max_redirects=MAX_REDIRECTS,
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": ACCEPTED},
        timeout=30.0,
        verify=tls_context(),
    )


def _sniff(first: bytes) -> str:
    """A media type for a body served without one."""
    if b"\0" in first[:1024]:
        return "application/octet-stream"
    return "text/html" if first.lstrip()[:1] == b"<" else "text/plain"


async def fetch(
    client: httpx.AsyncClient, url: str, *, max_bytes: int, timeout: float, accept: Callable[[str], bool]
) -> Fetched:
    """GET `url`, its body decoded and cut at `max_bytes`; raises FetchError for a bad scheme, a blocked
    address (the message starts with "blocked:"), an HTTP error status, too many redirects, the deadline,
    a network failure, a media type that `accept` refuses, or a body encoded more than once, in an
    encoding not asked for, or not valid in its encoding."""
    if urlsplit(url).scheme not in ("http", "https"):
        raise FetchError(f"only http and https URLs can be fetched, not {url!r}")
    try:
        async with asyncio.timeout(timeout), client.stream("GET", url) as response:
            if response.status_code >= 400:
                raise FetchError(f"HTTP {response.status_code} {response.reason_phrase} from {response.url}")
            media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
            chunks, first = decoded(response, max_bytes), b""
            if not media_type:
                first = await anext(chunks, b"")
                media_type = _sniff(first)
            if not accept(media_type):
                raise FetchError(f"{response.url} is {media_type}, which this tool does not read")
            body = bytearray(first)
            async for chunk in chunks:
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
    except Blocked as exc:
        raise FetchError(str(exc)) from None
    except Undecodable as exc:
        raise FetchError(f"{url}: {exc}") from None
    except httpx.InvalidURL as exc:  # e.g. an octal IPv4 address, 0177.0.0.1: not an HTTPError
        raise FetchError(f"{url} is not a valid URL: {exc}") from None
    except TimeoutError:
        raise FetchError(f"{url} did not answer completely within {timeout:g}s") from None
    except httpx.TooManyRedirects:
        raise FetchError(f"{url} redirects more than {MAX_REDIRECTS} times") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"could not fetch {url}: {str(exc) or type(exc).__name__}") from None
