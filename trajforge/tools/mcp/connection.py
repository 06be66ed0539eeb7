"""One client session with one MCP server (the official SDK's ClientSession), kept by a task of its own:
the SDK's sessions and transports are anyio task groups, which must end in the task that began them,
while a sample's tool calls come from the agent's tasks.

A stdio server is a process of the sample (Environment.spawn): its stdout is read a line (one JSON-RPC
message) at a time, at most MESSAGE_LIMIT bytes each; a longer one, like the server's exit, ends the
connection, and every later call is a tool error saying so, with the tail of the server's stderr. A
streamable HTTP server is reached from the runner; a reply from it is bounded alike (an event of an event
stream by the SDK, any other body by CappedBodies, read as sent: not decompressed), and is an error of
its request only. Requests a server sends the client (sampling, which would spend the run's model key;
elicitation; roots) are refused, the SDK's default when no callback is given. A call is bounded by the
server's call_timeout (--command_timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession
from mcp.shared.message import SessionMessage

from trajforge.environments.contract import Spawned, SpawnedProcess
from trajforge.tail import Tail
from trajforge.tools.mcp.servers import Server

MESSAGE_LIMIT = 4 << 20  # bytes of one message from a server: a result, a listing
STDERR_TAIL = 2000  # bytes of a server's stderr kept, for the error that says why it stopped
EXIT_GRACE = 0.2  # seconds a stdio server gets to exit once its stdin is closed (the SDK's does not), before SIGTERM
Transport = Callable[[], AbstractAsyncContextManager[tuple[Any, Any]]]
# The SDK logs what it could not read of a reply (with a traceback, on stderr when nothing else handles it);
# what matters of it reaches the user as the call's tool error, or the start's message.
logging.getLogger("mcp").addHandler(logging.NullHandler())


class Connection:
    """A started and initialized session with `server`; close() ends it (and a stdio server's processes)."""

    def __init__(self, server: Server, transport: Transport, spawned: Spawned | None = None):
        self.server = server
        self.transport = transport
        self.spawned = spawned
        self.stderr = Tail(STDERR_TAIL)
        self.client: ClientSession | None = None
        self.ended = ""  # why the connection ended, once it has
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.stopping = asyncio.Event()
        self.task: asyncio.Task | None = None

    @classmethod
    async def stdio(cls, server: Server, spawned: Spawned) -> Connection:
        connection = cls(server, lambda: stdio_streams(spawned, connection), spawned)
        return await connection.start()

    @classmethod
    async def http(cls, server: Server) -> Connection:
        from mcp.client.streamable_http import streamable_http_client

        def transport() -> AbstractAsyncContextManager[tuple[Any, Any]]:
            return _http_streams(server, streamable_http_client)

        return await cls(server, transport).start()

    async def start(self) -> Connection:
        """Initialized within the server's start_timeout; else ended, and RuntimeError naming the server and
        its stderr's tail."""
        self.task = asyncio.create_task(self._keep())
        try:
            await asyncio.wait_for(asyncio.shield(self.ready), self.server.start_timeout)
        except BaseException as exc:
            await self.close()
            why = f"did not answer initialize within {self.server.start_timeout:g} s (--setup_timeout)"
            if not isinstance(exc, TimeoutError):
                why = f"did not start: {self.ended or _said(exc)}"
            raise RuntimeError(f"{self.server} {why}{self.stderr_note()}") from None
        return self

    async def _keep(self) -> None:
        try:
            async with self.transport() as (read, write), ClientSession(read, write) as client:
                await client.initialize()
                self.client = client
                self.ready.set_result(None)
                await self.stopping.wait()
        except BaseException as exc:  # the task's end: nothing above it to tell but the connection
            self.ended = self.ended or _said(exc)
            if not self.ready.done():
                self.ready.set_exception(RuntimeError(self.ended))
            if not isinstance(exc, Exception):
                raise
        finally:
            self.ended = self.ended or "the connection was closed"
            self.client = None

    def stderr_note(self) -> str:
        tail = self.stderr.text()
        return f"; its stderr ends: {tail}" if tail else ""

    async def list_tools(self, max_pages: int) -> list[types.Tool]:
        """Every tool it lists, page by page (at most `max_pages`: a server paging forever gets no further),
        each page within start_timeout; RuntimeError naming the server when it cannot list them."""
        client = self._client()
        tools: list[types.Tool] = []
        cursor = None
        timeout = self.server.start_timeout
        for _ in range(max_pages):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            try:
                page = await asyncio.wait_for(client.list_tools(params=params), timeout)
            except TimeoutError:
                why = f"did not list its tools within {timeout:g} s (--setup_timeout)"
                raise RuntimeError(f"{self.server} {why}") from None
            except Exception as exc:
                why = f"it stopped: {self.ended}" if self.ended or self.client is None else _said(exc)
                raise RuntimeError(f"{self.server} could not list its tools: {why}{self.stderr_note()}") from None
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise RuntimeError(f"{self.server} lists its tools over more than {max_pages} pages")

    async def call(self, tool: str, arguments: dict) -> types.CallToolResult:
        """tools/call within call_timeout; RuntimeError (the tool error) when it cannot answer."""
        client = self._client()
        timeout = self.server.call_timeout
        try:
            return await asyncio.wait_for(client.call_tool(tool, arguments), timeout)
        except TimeoutError:
            raise RuntimeError(
                f"{tool} of {self.server} did not answer within {timeout:g} s (--command_timeout)"
            ) from None
        except Exception as exc:
            if self.ended or self.client is None:  # the connection ended meanwhile: say why
                raise RuntimeError(f"{tool} of {self.server}: it stopped: {self.ended}{self.stderr_note()}") from None
            raise RuntimeError(f"{tool} of {self.server}: {_said(exc)}") from None

    def _client(self) -> ClientSession:
        if self.client is None:
            raise RuntimeError(f"{self.server} is not running: {self.ended or 'never started'}{self.stderr_note()}")
        return self.client

    async def close(self) -> None:
        """The session ended, a stdio server's stdin closed, and its process group ended after EXIT_GRACE."""
        self.stopping.set()
        if self.task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self.task), EXIT_GRACE + 1)
            if not self.task.done():
                self.task.cancel()
                with contextlib.suppress(BaseException):
                    await self.task
        if self.spawned is not None:
            await self.spawned.end()


def _said(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_said(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@asynccontextmanager
async def stdio_streams(spawned: Spawned, connection: Connection) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's message streams over a spawned server's pipes: one JSON-RPC message a line each way."""
    process = spawned.process
    assert process.stdin and process.stdout and process.stderr
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def from_server() -> None:
        async with read_send:
            while True:
                try:
                    line = await stdout.readline()
                except ValueError:  # longer than the stream's limit
                    connection.ended = f"it sent a message of more than {MESSAGE_LIMIT} bytes"
                    return
                if not line:
                    connection.ended = "it exited" + _exit_code(process)
                    return
                if line.strip():
                    try:
                        message: SessionMessage | Exception = SessionMessage(
                            types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        )
                    except ValueError as exc:
                        message = exc
                    await read_send.send(message)

    async def to_server() -> None:
        async with write_receive:
            async for message in write_receive:
                stdin.write(message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")
                await stdin.drain()

    async def keep_stderr() -> None:
        while chunk := await stderr.read(65536):
            connection.stderr.feed(chunk)

    async with anyio.create_task_group() as group:
        group.start_soon(from_server)
        group.start_soon(_ending_on_error, to_server, read_send)
        group.start_soon(keep_stderr)
        try:
            yield read_receive, write_send
        finally:
            stdin.close()  # a server ends when its stdin does; else its group is ended by close()
            with anyio.move_on_after(EXIT_GRACE):
                while process.returncode is None:  # not wait(): it waits for the pipes too, which a child may hold
                    await anyio.sleep(0.01)
            group.cancel_scope.cancel()


async def _ending_on_error(pump: Callable, read_send: Any) -> None:
    """A pipe that broke (the server exited) ends what the session reads, so no request waits on it."""
    try:
        await pump()
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await read_send.aclose()


def _exit_code(process: SpawnedProcess) -> str:
    return f" (exit status {process.returncode})" if process.returncode is not None else ""


@asynccontextmanager
async def _http_streams(server: Server, client: Callable) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's streams over HTTP, its replies bounded as a stdio server's messages are: an event of an event
    stream by the SDK (max_sse_event_size), any other body by CappedBodies."""
    headers = {**server.headers, "Accept-Encoding": "identity"}  # what is capped is what is parsed
    async with (
        httpx2.AsyncClient(headers=headers, timeout=server.call_timeout, transport=CappedBodies()) as http,
        client(server.url, http_client=http, max_sse_event_size=MESSAGE_LIMIT) as (read, write),
    ):
        yield read, write


class TooLong(httpx2.StreamError):  # what the SDK catches from a reply's body: it answers the request with it
    pass


class Capped(httpx2.AsyncByteStream):
    """A body that ends with TooLong once longer than MESSAGE_LIMIT bytes, reading no more of it."""

    def __init__(self, stream: httpx2.AsyncByteStream):
        self.stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self.stream:
            size += len(chunk)
            if size > MESSAGE_LIMIT:
                raise TooLong(f"a reply of more than {MESSAGE_LIMIT} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


class CappedBodies(httpx2.AsyncHTTPTransport):
    """Replies read as sent (not decoded: a small compressed body may unpack to gigabytes), each but an event
    stream Capped, so that a flood is a tool error (or exit 2 at the start's listing) as its bytes arrive."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-encoding"]
        events = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        stream = response.stream if events else Capped(response.stream)  # type: ignore[arg-type]
        return httpx2.Response(response.status_code, headers=headers, stream=stream, extensions=response.extensions)
