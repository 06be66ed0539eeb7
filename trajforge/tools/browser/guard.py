"""The browser's guard: a small forward proxy on 127.0.0.1 that every request of a guarded browser
context goes through (pages, subresources, each hop of a redirect, WebSockets), which reaches only
public addresses (netguard.py).

Chromium hands the proxy the name and port, never resolves the name itself: the proxy resolves it once,
checks every address and connects to a checked one, so a DNS rebinding gains nothing. A plain HTTP request
arrives in absolute form (`GET http://host/path`) and is passed on in origin form with `Connection:
close`, one request per connection, since Chromium may send the next request on the same connection to
another host. https and WebSockets arrive as CONNECT host:port and are tunnelled. A refused target gets a
403 whose body is the `blocked: ...` reason; Chromium shows it as the page for plain HTTP and fails a
refused tunnel (net::ERR_TUNNEL_CONNECTION_FAILED), whose reason `refusal` keeps for the tool to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import urlsplit

from trajforge.tools.netguard import DEFAULT_PORTS, Blocked, Resolver, origin, reachable_addresses, system_resolver

HEADER_LIMIT = 64 * 1024  # bytes of a request line and headers
HEADER_TIMEOUT = 30.0  # seconds for a client to send them
CONNECT_TIMEOUT = 10.0  # seconds to reach the target, all its addresses together
IDLE_TIMEOUT = 120.0  # seconds without a byte either way before a connection is dropped
BLOCKED_HEADER = "X-Trajforge-Blocked"  # marks the proxy's own refusal, as opposed to a site's 403
REFUSALS_KEPT = 256
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization"}

Connect = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class BadRequest(Exception):
    pass


class GuardProxy:
    """One per browser: started on first use, shared by the browser's contexts, closed with it."""

    def __init__(
        self,
        resolver: Resolver = system_resolver,
        trusted: frozenset[str] = frozenset(),
        connect: Connect | None = None,
    ):
        self.resolver = resolver
        self.trusted = trusted  # host:port let through unchecked: the mock model's own server
        self.connect = connect or asyncio.open_connection  # a stand-in in tests, to follow a public address
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._refusals: OrderedDict[str, str] = OrderedDict()  # host:port -> the latest blocked reason

    async def start(self) -> str:
        """The proxy's address for Playwright's `proxy` option, started if it is not running."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=HEADER_LIMIT)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        """Stop listening and drop every connection still open."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    def refusal(self, url: str) -> str | None:
        """The `blocked: ...` reason the proxy last gave the host and port of `url`, if it refused them."""
        try:
            parts = urlsplit(url)
            return self._refusals.get(origin(parts.hostname or "", parts.port or DEFAULT_PORTS[parts.scheme]))
        except (ValueError, KeyError):
            return None

    async def _serve(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection's handler runs as a task
        self._connections.add(task)
        upstream = None
        try:
            try:
                async with asyncio.timeout(HEADER_TIMEOUT):
                    head = await client_reader.readuntil(b"\r\n\r\n")
                method, host, port, forwarded = _parse(head)
            except asyncio.LimitOverrunError:
                return await _refuse(client, 431, "request headers too large")
            except BadRequest as exc:
                return await _refuse(client, 400, str(exc))
            try:
                upstream_reader, upstream = await self._open(host, port)
            except Blocked as exc:
                self._remember(origin(host, port), str(exc))
                return await _refuse(client, 403, str(exc), blocked=True)
            except (OSError, TimeoutError) as exc:
                return await _refuse(client, 502, f"could not connect to {host}:{port}: {exc or 'timed out'}")
            if method == "CONNECT":
                client.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.write(forwarded)
            await _relay(client_reader, client, upstream_reader, upstream)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # the client left or stalled
        except asyncio.CancelledError:
            pass  # close(): end quietly, since asyncio (3.11) reports a cancelled connection handler as an error
        finally:
            self._connections.discard(task)
            for writer in (upstream, client):
                if writer is not None:
                    writer.close()

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to a checked address of host (the first that answers)."""
        async with asyncio.timeout(CONNECT_TIMEOUT):
            addresses = await reachable_addresses(host, port, self.resolver, self.trusted)
            failure: OSError = OSError(f"{host} resolves to no address")
            for address in addresses:
                try:
                    return await self.connect(address, port)
                except OSError as exc:  # e.g. an IPv6 address and no IPv6 route: the next one
                    failure = exc
            raise failure

    def _remember(self, key: str, reason: str) -> None:
        self._refusals[key] = reason
        self._refusals.move_to_end(key)
        while len(self._refusals) > REFUSALS_KEPT:
            self._refusals.popitem(last=False)


def _parse(head: bytes) -> tuple[str, str, int, bytes]:
    """(method, host, port, what to send upstream) of a proxy request: CONNECT host:port, or a plain
    HTTP request in absolute form, rewritten to origin form for one request on its own connection."""
    request_line, *headers = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = request_line.split(" ")
    except ValueError:
        raise BadRequest(f"not an HTTP request line: {request_line[:200]!r}") from None
    try:
        parts = urlsplit(target if method != "CONNECT" else f"//{target}")
        host, port = parts.hostname, parts.port
    except ValueError:
        raise BadRequest(f"not a valid target: {target[:200]!r}") from None
    if method == "CONNECT":
        if not host or port is None:
            raise BadRequest(f"CONNECT needs host:port, not {target[:200]!r}")
        return method, host, port, b""
    if parts.scheme != "http" or not host:
        raise BadRequest(f"a proxy request names an http:// URL, not {target[:200]!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kept = [line for line in headers if line and line.split(":", 1)[0].strip().lower() not in HOP_BY_HOP]
    forwarded = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
    return method, host, port or 80, forwarded.encode("latin-1")


async def _refuse(client: asyncio.StreamWriter, status: int, message: str, blocked: bool = False) -> None:
    body = message.encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *([f"{BLOCKED_HEADER}: 1"] if blocked else []),
    ]
    client.write("\r\n".join([*lines, "", ""]).encode() + body)
    with contextlib.suppress(ConnectionError):
        await client.drain()


async def _relay(
    client_reader: asyncio.StreamReader,
    client: asyncio.StreamWriter,
    upstream_reader: asyncio.StreamReader,
    upstream: asyncio.StreamWriter,
) -> None:
    """Pipe both ways until either side ends (then the caller closes both) or nothing moves for IDLE_TIMEOUT."""
    last = [time.monotonic()]
    pipes = [
        asyncio.create_task(_pipe(client_reader, upstream, last)),
        asyncio.create_task(_pipe(upstream_reader, client, last)),
    ]
    try:
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, last: list[float]) -> None:
    while True:
        try:
            data = await asyncio.wait_for(reader.read(65536), IDLE_TIMEOUT)
        except TimeoutError:
            if time.monotonic() - last[0] < IDLE_TIMEOUT:  # the other direction is busy
                continue
            return
        except ConnectionError:
            return
        if not data:
            return
        last[0] = time.monotonic()
        writer.write(data)
        try:
            await writer.drain()
        except ConnectionError:
            return
