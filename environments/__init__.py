"""Where a prompt's commands and files live. One environment per prompt, closed after it.

An environment is any object with these four coroutines; a failed command is data, not an exception:

    execute(command, timeout) -> {"output": str, "exit_code": int, "error": str | None}
    read_file(path) -> str
    write_file(path, data) -> None
    close() -> None
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

OUTPUT_LIMIT = 32_000  # bytes of command output kept: the head and the tail, half each
FILE_LIMIT = 10_000_000  # bytes read_file will load


class Environment(Protocol):
    async def execute(self, command: str, timeout: float | None = None) -> dict: ...
    async def read_file(self, path: str) -> str: ...
    async def write_file(self, path: str, data: str) -> None: ...
    async def close(self) -> None: ...


class SetupError(Exception):
    """An environment could not be set up: the prompt fails and is retried on --resume."""


@dataclass(frozen=True)
class EnvironmentSettings:
    kind: str = "local"
    command_timeout: float = 180.0
    keep_workspaces: bool = False


class CappedOutput:
    """Keeps the first and last OUTPUT_LIMIT/2 bytes of a stream and counts what it drops, so one
    `cat` of a huge file cannot blow up a trajectory."""

    def __init__(self, limit: int = OUTPUT_LIMIT):
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


async def open_environment(settings: EnvironmentSettings, entry: dict) -> Environment:
    """A fresh environment for one dataset entry (its `cwd`, later its image)."""
    from environments.local import LocalEnvironment

    return LocalEnvironment(entry.get("cwd"), settings)
