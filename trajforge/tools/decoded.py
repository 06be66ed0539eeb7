"""A response body decoded here, as its bytes arrive, with a cap on what it decodes to.

httpx decodes a `Content-Encoding` chunk by chunk without a bound on what one chunk becomes, and applies a
stack of them (`gzip, gzip`) in turn: 5 KB on the wire can be gigabytes in memory before any cap on the
decoded chunks is checked. Here the raw bytes are decoded by zlib in steps of at most STEP bytes, and the
reading stops one byte past the cap, so memory stays within the cap plus a constant and the event loop
gets its turn between steps. One encoding at most, and only those the clients ask for (ACCEPTED)."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only named here: the tools settings import this module at batch_runner.py's start
    import httpx

ACCEPTED = "gzip, deflate"  # the Accept-Encoding of the tools' clients: what this module decodes
STEP = 64 * 1024  # bytes one decoding step may give
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class Undecodable(Exception):
    """A body encoded more than once, with an encoding not decoded here, or not valid in its encoding."""


class _Inflater:
    """gzip or deflate, decoded in steps of at most STEP bytes."""

    def __init__(self, encoding: str):
        self.encoding = encoding
        self.inflater = zlib.decompressobj(_WBITS[encoding])
        self.started = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        while not self.inflater.eof:  # bytes after the end of the stream are ignored, as httpx does
            try:
                piece = self.inflater.decompress(data, STEP)
            except zlib.error as exc:
                if self.encoding == "deflate" and not self.started:  # a raw deflate stream, without zlib's header
                    self.inflater, self.started = zlib.decompressobj(-zlib.MAX_WBITS), True
                    continue
                raise Undecodable(f"the body is not valid {self.encoding} data: {exc}") from None
            self.started = True
            data = self.inflater.unconsumed_tail
            if piece:
                yield piece
            if not data and len(piece) < STEP:  # a full step may leave output inside zlib: asked again
                return


def _identity(data: bytes) -> Iterator[bytes]:
    yield data


def encoding_of(response: httpx.Response) -> str:
    """The body's one encoding ("identity" for none); Undecodable for a stack of them or an unknown one."""
    header = response.headers.get("content-encoding", "")
    encodings = [part.strip().lower() for part in header.split(",") if part.strip().lower() not in ("", "identity")]
    if len(encodings) > 1:
        raise Undecodable(f"the body is encoded {len(encodings)} times ({header.strip()}): not decoded")
    if encodings and encodings[0] not in _WBITS:
        raise Undecodable(f"the body is encoded with {encodings[0]!r}, which was not asked for: not decoded")
    return encodings[0] if encodings else "identity"


async def decoded(response: httpx.Response, limit: int) -> AsyncIterator[bytes]:
    """The body of a streamed `response`, decoded, in pieces; it stops once more than `limit` bytes have
    come out (limit + 1 at most in all). Raises Undecodable as `encoding_of` does, or for invalid data."""
    encoding = encoding_of(response)
    decode = _Inflater(encoding).pieces if encoding != "identity" else _identity
    left = limit + 1
    async for raw in response.aiter_raw():
        for piece in decode(raw):
            piece = piece[:left]
            left -= len(piece)
            yield piece
            if not left:
                return


async def read_decoded(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """(the first `limit` bytes of the decoded body, whether there were more)."""
    body = bytearray()
    async for piece in decoded(response, limit):
        body += piece
    return bytes(body[:limit]), len(body) > limit
