"""An environment seen through a filter: text that must never reach a trajectory (the API key a command
finds with `ps`, an ephemeral system prompt) is replaced in command output and in files read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from trajforge.environments.contract import Environment, ExecResult, Spawned


class Redacted(Environment):
    def __init__(self, inner: Environment, redact: Callable[[str], str]):
        self.inner = inner
        self.redact = redact

    async def start(self) -> None:
        await self.inner.start()

    async def exec(self, command: str, timeout: float | None = None, *, capped: bool = True) -> ExecResult:
        result = await self.inner.exec(command, timeout, capped=capped)
        return replace(result, output=self.redact(result.output))

    async def read_file(self, path: str) -> str:
        return self.redact(await self.inner.read_file(path))

    async def write_file(self, path: str, data: str | bytes) -> None:
        await self.inner.write_file(path, data)

    async def write_files(self, files: dict[str, bytes]) -> None:
        await self.inner.write_files(files)

    async def spawn(
        self, argv: list[str], variables: dict[str, str], read_only: tuple[str, ...] = (), limit: int = 1 << 16
    ) -> Spawned:
        return await self.inner.spawn(argv, variables, read_only, limit)  # its output is redacted by its reader

    async def verification_ahead(self, verified: bool) -> None:
        await self.inner.verification_ahead(verified)

    async def agent_begins(self, verified: bool) -> None:
        await self.inner.agent_begins(verified)

    async def add_tests(self, files: dict[str, bytes]) -> None:
        await self.inner.add_tests(files)

    @property
    def tests_dir(self) -> str | None:
        return self.inner.tests_dir

    @tests_dir.setter
    def tests_dir(self, value: str | None) -> None:
        self.inner.tests_dir = value

    async def put_folder(self, path: str, files: dict[str, bytes]) -> None:
        await self.inner.put_folder(path, files)

    async def fresh_copy(self) -> Environment:
        return Redacted(await self.inner.fresh_copy(), self.redact)

    async def verification_room(self) -> Environment:
        room = await self.inner.verification_room()
        return self if room is self.inner else Redacted(room, self.redact)

    async def remove_escapes(self) -> str:
        return self.redact(await self.inner.remove_escapes())

    async def enter_clean_room(self) -> str:
        return self.redact(await self.inner.enter_clean_room())

    async def close(self) -> None:
        await self.inner.close()
