"""What is kept of a stream that may be of any size, in bounded memory: its last bytes (a server's stderr,
a build's output: what it said last is what says why it failed), or its first and last (a command's
output, a tool's result)."""

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


class CappedOutput:
    """Keeps the first and last limit/2 bytes of a stream and counts what it drops, so one `cat` of a
    huge file cannot blow up a trajectory."""

    def __init__(self, limit: int):
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        excess = len(self.tail) - self.half
        if excess > 0:
            self.dropped += excess
            del self.tail[:excess]

    def text(self) -> str:
        marker = f"\n[... {self.dropped} bytes of output omitted ...]\n" if self.dropped else ""
        return self.head.decode(errors="replace") + marker + self.tail.decode(errors="replace")


def capped(text: str, limit: int) -> str:
    """`text` as CappedOutput keeps it: its first and last limit/2 bytes, with a marker between."""
    output = CappedOutput(limit)
    output.feed(text.encode(errors="surrogatepass"))
    return output.text()
