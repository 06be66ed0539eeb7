"""HTTP/1.1 exchanges as they travel on the wire, shared by the recording proxy and the replay server.

An exchange keeps the request's method, target and body, and the response exactly as the server sent
it: its head (status line and headers, byte for byte) and its body as the server framed it (the data
of each chunk of a chunked body, so the events of a stream keep their boundaries; else the whole body).
Bytes are stored as text decoded with `surrogateescape`, so a fixture is readable JSON and still gives
back every byte, even a chunk that ends inside a UTF-8 character.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

CRLF = b"\r\n"
HEAD_END = b"\r\n\r\n"


class WireError(Exception):
    """A message this module cannot frame (or that a recording could not replay byte for byte)."""


def text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def raw(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    head: bytes  # as received, for a proxy to pass on unchanged

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def body_value(self):
        """The body as JSON when it is JSON, else its text ("" when empty)."""
        try:
            return json.loads(self.body) if self.body else ""
        except ValueError:
            return text(self.body)


@dataclass
class Response:
    """A response as sent: its head, how its body was framed, and the body's pieces."""

    head: str
    framing: str  # "chunked" (pieces are the chunks' data), "length" or "close" (one piece)
    chunks: list[str] = field(default_factory=list)

    @property
    def status(self) -> int:
        return int(self.head.split(" ", 2)[1])

    @property
    def headers(self) -> dict[str, str]:
        return parse_headers(raw(self.head))

    @property
    def body(self) -> bytes:
        return b"".join(raw(chunk) for chunk in self.chunks)

    def keeps_alive(self, request: Request) -> bool:
        """Whether the connection carries another request after this response to `request`."""
        closing = "close" in (self.headers.get("connection", "").lower(), request.headers.get("connection", "").lower())
        return self.framing != "close" and not closing

    def to_json(self) -> dict:
        return {"head": self.head, "framing": self.framing, "chunks": self.chunks}

    @classmethod
    def from_json(cls, data: dict) -> Response:
        if data.get("framing") not in ("chunked", "length", "close"):
            raise WireError(f"unknown body framing {data.get('framing')!r}")
        return cls(data["head"], data["framing"], list(data["chunks"]))


def parse_headers(head: bytes) -> dict[str, str]:
    """The header fields of a message head (lower-case names; a repeated field keeps its last value)."""
    fields = {}
    for line in head.split(CRLF)[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            fields[text(name).strip().lower()] = text(value).strip()
    return fields


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on a connection; None when the client closed it between requests."""
    try:
        head = await reader.readuntil(HEAD_END)
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise WireError("connection closed in the middle of a request head") from None
        return None
    method, target, _ = text(head.split(CRLF, 1)[0]).split(" ", 2)
    headers = parse_headers(head)
    if "transfer-encoding" in headers:
        raise WireError("a chunked request body: our client never sends one")
    body = await reader.readexactly(int(headers.get("content-length") or 0))
    return Request(method, target, headers, body, head)


async def read_response_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(HEAD_END)


def framing_of(status: int, method: str, headers: dict[str, str]) -> str:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked"
    if "content-length" in headers or status in (204, 304) or method == "HEAD":
        return "length"
    return "close"


async def body_pieces(reader: asyncio.StreamReader, framing: str, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The body's pieces as they arrive: each chunk's data (chunked), else all of it. Refuses framing
    that `encode_chunk` would not give back byte for byte (chunk extensions, upper-case sizes,
    trailers), so a recording that passes here replays exactly."""
    if framing == "length":
        yield await reader.readexactly(int(headers.get("content-length") or 0))
        return
    if framing == "close":
        yield await reader.read()
        return
    while True:
        size_line = await reader.readuntil(CRLF)
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise WireError(f"chunk size line {size_line!r} is not a hex number") from None
        if size_line != f"{size:x}".encode() + CRLF:
            raise WireError(f"chunk size line {size_line!r} is not in the form a replay sends")
        if size == 0:
            if await reader.readuntil(CRLF) != CRLF:
                raise WireError("a chunked body with trailer fields")
            return
        data = await reader.readexactly(size)
        if await reader.readexactly(2) != CRLF:
            raise WireError("a chunk not followed by CRLF")
        yield data


def encode_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body as it goes on the wire; b"" gives the last chunk."""
    return f"{len(data):x}".encode() + CRLF + data + CRLF + (CRLF if not data else b"")


async def send_piece(writer: asyncio.StreamWriter, framing: str, data: bytes) -> None:
    """One piece of a body, framed as recorded, sent at once (a stream's events leave one by one)."""
    writer.write(encode_chunk(data) if framing == "chunked" else data)
    await writer.drain()


async def send_end(writer: asyncio.StreamWriter, framing: str) -> None:
    if framing == "chunked":
        writer.write(encode_chunk(b""))
        await writer.drain()


async def write_response(writer: asyncio.StreamWriter, response: Response) -> None:
    """Send `response` as recorded: its head, then its body with the recorded framing, chunk by chunk."""
    writer.write(raw(response.head))
    for chunk in response.chunks:
        await send_piece(writer, response.framing, raw(chunk))
    await send_end(writer, response.framing)


@dataclass
class Exchange:
    """One request and the response the server gave it."""

    method: str
    path: str
    body: object  # the request body: JSON when it was JSON, else its text
    response: Response

    def to_json(self) -> dict:
        request = {"method": self.method, "path": self.path, "body": self.body}
        return {"request": request, "response": self.response.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> Exchange:
        request = data["request"]
        return cls(request["method"], request["path"], request["body"], Response.from_json(data["response"]))


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class ThreadedServer:
    """An asyncio TCP server on 127.0.0.1 run from a background thread, so a test or a script can serve
    while it drives a subprocess."""

    def __init__(self, handler: Handler):
        self._handler = handler
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = 0

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve; returns the server's URL (http://host:port)."""
        ready = threading.Event()
        self._loop = loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            listening = asyncio.start_server(self._handler, host, port, backlog=1024)  # many workers at once
            server = loop.run_until_complete(listening)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            server.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        ready.wait()
        return f"http://{host}:{self.port}"

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Run `callback` on the server's own loop (what touches its asyncio objects must)."""
        assert self._loop is not None, "call_soon() before start()"
        self._loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        if self._loop:  # once: a test may stop a server before its fixture does
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop = None
