"""The last bytes of a stream that may be of any size (a server's stderr, a build's output), kept in
bounded memory: what it said last is what says why it failed."""

from __future__ import annotations


class Tail:
    """The last `size` bytes fed; `dropped` counts those before them."""

    def __init__(self, size: int):
        self.size = size
        self.data = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        self.data += chunk
        cut = max(0, len(self.data) - self.size)
        self.dropped += cut
        del self.data[:cut]

    def text(self) -> str:
        return self.data.decode(errors="replace").strip()
