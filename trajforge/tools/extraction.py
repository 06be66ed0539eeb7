"""A page's text extracted where it can be stopped: some pages (one table row of many cells) take
trafilatura CPU time quadratic in their size, 150 s for 800 KB and about 40 minutes at the 2 MB cap, and a
thread doing it could be neither stopped nor kept from the worker's thread pool. A worker's pages go to
at most HELPERS helper processes (tools/page_text.py run as a script: a fresh interpreter, never a fork of
the worker), started on first use and kept between pages; one still extracting at its page's deadline is
killed, the page is a tool error, and the next page starts another helper."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys

from trajforge.tools.page_text import ANSWER, READY, REQUEST

HELPERS = 2  # per worker: more pages at once wait their turn (each ahead of them ends by its deadline)
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page_text.py")
START_TIMEOUT = 60.0  # seconds for a helper to import trafilatura, not counted in a page's deadline


class ExtractionError(Exception):
    """A page whose text did not come: past its deadline, unreadable, or its helper gone."""


class _Helper:
    def __init__(self, process: asyncio.subprocess.Process):
        self.process = process

    @classmethod
    async def start(cls) -> _Helper:
        """-P: the script's folder (this package's tools) is not put on the helper's import path."""
        argv = [sys.executable, "-P", SCRIPT, str(os.getpid())]
        pipe = asyncio.subprocess.PIPE
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=pipe, stdout=pipe, stderr=asyncio.subprocess.DEVNULL
            )
        except OSError as exc:
            raise ExtractionError(f"cannot start the text extraction process: {exc}") from None
        helper = cls(process)
        try:
            assert process.stdout is not None
            ready = await asyncio.wait_for(process.stdout.readexactly(len(READY)), START_TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            ready = b""
        finally:
            if process.returncode is not None or not ready:
                await helper.kill()
        if ready != READY:
            raise ExtractionError("the text extraction process did not start (is trafilatura installed?)")
        return helper

    async def ask(self, html: bytes, url: str) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        encoded = url.encode("utf-8", "surrogateescape")
        self.process.stdin.write(REQUEST.pack(len(encoded), len(html)) + encoded + html)
        await self.process.stdin.drain()
        (size,) = ANSWER.unpack(await self.process.stdout.readexactly(ANSWER.size))
        return json.loads(await self.process.stdout.readexactly(size))

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()  # at once: a second cancellation while waiting leaves it killed all the same
        await self.process.wait()


class Extractor:
    """A worker's page texts, shared by every prompt it runs; closed with the worker's tool services."""

    def __init__(self, helpers: int = HELPERS):
        self._idle: list[_Helper] = []
        self._turns = asyncio.Semaphore(helpers)

    async def text(self, html: bytes, url: str, timeout: float) -> tuple[str | None, str]:
        """(title, text) of the page, within `timeout` seconds of extraction; else ExtractionError."""
        async with self._turns:
            helper = await self._helper()
            try:
                answer = await asyncio.wait_for(helper.ask(html, url), timeout)
            except TimeoutError:
                await helper.kill()
                raise ExtractionError(f"the page's text was not extracted within {timeout:g}s") from None
            except (asyncio.IncompleteReadError, ConnectionError):
                await helper.kill()
                raise ExtractionError("the text extraction process ended while reading the page") from None
            except BaseException:  # cancelled (the prompt's own deadline): the helper is in the middle of a page
                await helper.kill()
                raise
            self._idle.append(helper)
        if "error" in answer:
            raise ExtractionError(answer["error"])
        return answer["title"], answer["text"]

    async def _helper(self) -> _Helper:
        """An idle helper still alive, else a new one."""
        while self._idle:
            helper = self._idle.pop()
            if helper.process.returncode is None:
                return helper
            await helper.kill()  # ended while idle (killed from outside): collected
        return await _Helper.start()

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().kill()
