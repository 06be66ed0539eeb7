"""A worker's side of the run's browser service (service.py): its browser tool calls run in the
one process that drives Chromium for every worker of the run, over a Unix socket.

Messages are length-prefixed JSON. A call names its prompt, so each prompt has its own browser context
there; the prompt's end releases it, and the end of this worker's connection releases all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import Awaitable, Callable

import orjson

from trajforge.tools.browser.runtime import BrowserUnavailable

HEADER = struct.Struct(">I")


def frame(message: dict) -> bytes:
    body = orjson.dumps(message)
    return HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> dict | None:
    """The next message, or None once the other side has gone."""
    try:
        size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
        return orjson.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class BrowserClient:
    """What ToolServices.browser is in a worker of a local run: runs its browser tools in the service."""

    def __init__(self, address: str):
        self.address = address  # the service's Unix socket
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task | None = None
        self._replies: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._lock = asyncio.Lock()

    async def run(self, session, function: Callable[..., Awaitable[dict]], arguments: dict) -> dict:
        """The result of browser tool `function` called for `session`'s prompt."""
        prompt = await session.resource("browser", self._prompt)
        return await self.ask({"prompt": prompt.id, "tool": function.__name__, "arguments": arguments})

    async def _prompt(self) -> RemotePrompt:
        return RemotePrompt(self, next(self._ids))

    async def ask(self, message: dict) -> dict:
        writer = await self._connection()
        ident = next(self._ids)
        reply = self._replies[ident] = asyncio.get_running_loop().create_future()
        try:
            writer.write(frame(message | {"id": ident}))
            return await reply
        finally:
            self._replies.pop(ident, None)

    async def _connection(self) -> asyncio.StreamWriter:
        async with self._lock:
            if self._writer is None:
                try:
                    reader, self._writer = await asyncio.open_unix_connection(self.address)
                except OSError as exc:
                    raise BrowserUnavailable(f"the run's browser could not be reached: {exc}") from None
                self._reading = asyncio.create_task(self._read(reader, self._writer))
            return self._writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (message := await read_frame(reader)) is not None:
                reply = self._replies.get(message["id"])
                if reply is not None and not reply.done():
                    reply.set_result(message["result"])
        finally:
            if self._writer is writer:
                self._writer = None  # the next call connects again
            writer.close()
            for reply in self._replies.values():
                if not reply.done():
                    reply.set_exception(BrowserUnavailable("the run's browser has gone"))

    async def close(self) -> None:
        """The service closes whatever browser contexts this worker's prompts still hold."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading


class RemotePrompt:
    """A prompt's browser context in the service, as a resource of the prompt's session."""

    def __init__(self, client: BrowserClient, ident: int):
        self.client = client
        self.id = ident

    async def close(self) -> None:
        await self.client.ask({"prompt": self.id, "release": True})
