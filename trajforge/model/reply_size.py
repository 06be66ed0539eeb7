"""The size limit of a reply from the endpoint, enforced while its bytes arrive so that a hostile or
broken server cannot fill the worker's memory (a plain body or the sum of a stream's chunks alike)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import httpx

from trajforge.model.retry import BadReply

MAX_REPLY_BYTES = 20 * 2**20
# Asked of the server so the bytes counted are the bytes kept: a compressed reply could expand a
# thousandfold past any limit on what came over the wire.
ACCEPT_ENCODING = {"Accept-Encoding": "identity"}


class TooLarge(BadReply):
    def __init__(self, limit: int):
        super().__init__(f"reply larger than {limit / 2**20:g} MB: not read further")


class CappedStream(httpx.AsyncByteStream):
    """A response body that raises TooLarge as soon as more than `limit` bytes have come."""

    def __init__(self, stream: httpx.AsyncByteStream, limit: int):
        self._stream = stream
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._limit:
                raise TooLarge(self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def refusal(encoding: str, length: str, limit: int = MAX_REPLY_BYTES) -> BadReply | None:
    """Why a reply is refused from its head alone (its Content-Encoding and Content-Length, as httpx reads
    them): a body announced larger than `limit`, or compressed although we asked for none."""
    encoding = encoding.strip().lower()
    if encoding not in ("", "identity"):
        return BadReply(f"reply compressed with {encoding!r} although the request asked for none")
    if length.isdigit() and int(length) > limit:
        return TooLarge(limit)
    return None


def capper(limit: int = MAX_REPLY_BYTES):
    """An httpx response hook (it runs before the body is read) that caps the body at `limit` bytes;
    a body announced larger, or compressed although we asked for none, is refused at once."""

    async def cap(response: httpx.Response) -> None:
        headers = response.headers
        refused = refusal(headers.get("content-encoding", "identity"), headers.get("content-length", ""), limit)
        if refused is not None:
            raise refused
        # An async client's response: its stream is an async one.
        response.stream = CappedStream(cast(httpx.AsyncByteStream, response.stream), limit)

    return cap
