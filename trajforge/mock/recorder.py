"""A recording reverse proxy: every HTTP exchange between a client and a server passes through unchanged
and as it happens (a stream goes on chunk by chunk, as the server sent it), and a copy of it is kept for
a fixture that trajforge/mock/replay.py serves again."""

from __future__ import annotations

import asyncio
import contextlib

from trajforge.mock.wire import (
    Exchange,
    Response,
    ThreadedServer,
    WireError,
    body_pieces,
    framing_of,
    parse_headers,
    read_request,
    read_response_head,
    send_end,
    send_piece,
    text,
)


class RecordingProxy:
    """Forwards to `host:port`; `exchanges` holds what passed, in the order the responses ended;
    `problems` what could not be recorded faithfully (a recording with problems is not to be kept)."""

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self.exchanges: list[Exchange] = []
        self.problems: list[str] = []
        self._server = ThreadedServer(self._connection)

    def start(self) -> str:
        return self._server.start()

    def stop(self) -> None:
        self._server.stop()

    @property
    def port(self) -> int:
        return self._server.port

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await read_request(reader)) is not None:
                if not await self._forward(request, writer):
                    break
        except WireError as exc:
            self.problems.append(str(exc))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away; what it had fully received is recorded
        finally:
            writer.close()

    async def _forward(self, request, writer: asyncio.StreamWriter) -> bool:
        """Pass one request on over a connection of its own (so the server's keep-alive timing never
        meets ours) and its response back, recording both; whether the client connection stays open."""
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        try:
            up_writer.write(request.head + request.body)
            await up_writer.drain()
            head = await read_response_head(up_reader)
            writer.write(head)
            headers = parse_headers(head)
            response = Response(text(head), framing_of(int(text(head).split(" ", 2)[1]), request.method, headers))
            async for data in body_pieces(up_reader, response.framing, headers):
                response.chunks.append(text(data))
                await send_piece(writer, response.framing, data)
            await send_end(writer, response.framing)
        finally:
            up_writer.close()
            with contextlib.suppress(ConnectionError):
                await up_writer.wait_closed()
        self.exchanges.append(Exchange(request.method, request.path, request.body_value(), response))
        return response.keeps_alive(request)
