"""The run's browser service: one process drives one headless Chromium through one Playwright driver and
runs the browser tools for every local worker process, which reach it over a Unix socket
(client.py). A Playwright driver per worker would cost each of them most of a second of CPU.

Each prompt gets a browser context of its own, closed when the prompt ends or its worker's connection
does (a killed worker leaves nothing open). The service launches Chromium as soon as it is forked, while
the run starts its other helpers, and gets the tool settings (the guard's trusted origins) afterwards.
It stops with the run, however the run ends, and dies with the runner if that is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from trajforge.tools.browser import tools as browser
from trajforge.tools.browser.client import frame, read_frame
from trajforge.tools.browser.guard import GuardProxy
from trajforge.tools.browser.runtime import LAUNCH_TIMEOUT_MS, BrowserLauncher, BrowserUnavailable, die_with_parent
from trajforge.tools.session import Resources
from trajforge.tools.settings import ToolSettings

STOP_GRACE = 5.0  # seconds the service gets to close Chromium after SIGTERM
TOOLS = {tool.__name__: tool for tool in browser.TOOLS}


class BrowserService:
    """The parent's handle on the service process."""

    def __init__(self, executable: str):
        self.folder = tempfile.mkdtemp(prefix="trajforge-browser-")  # private (0700): only we can connect
        self.address = os.path.join(self.folder, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.address)
        listener.listen(64)  # workers may connect before the service accepts: the kernel queues them
        self.channel, theirs = multiprocessing.Pipe()
        context = multiprocessing.get_context("fork")
        self.process = context.Process(target=_main, args=(executable, listener, theirs), daemon=True)
        self.process.start()
        self.terminated = False
        listener.close()
        theirs.close()

    def ready(self, settings: ToolSettings) -> str:
        """Wait for the browser, hand the service the run's tool settings and return the address that
        workers connect to; BrowserUnavailable if the browser could not be launched."""
        try:
            if not self.channel.poll(LAUNCH_TIMEOUT_MS / 1000 + STOP_GRACE):
                raise BrowserUnavailable("the browser did not start in time")
            problem = self.channel.recv()
        except EOFError:
            raise BrowserUnavailable(f"the browser service exited with {self.process.exitcode}") from None
        if problem:
            raise BrowserUnavailable(problem)
        self.channel.send(settings)
        return self.address

    def terminate(self) -> None:
        """SIGTERM, once: the service closes Chromium, while the run goes on with what is left to do."""
        if not self.terminated:
            self.terminated = True
            self.process.terminate()

    def stop(self) -> None:
        """SIGTERM (if not sent yet) and wait: SIGKILL if closing Chromium takes too long."""
        self.terminate()
        self.process.join(STOP_GRACE)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.channel.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def browser_service(executable: str) -> Iterator[BrowserService]:
    service = BrowserService(executable)
    try:
        yield service
    finally:
        service.stop()


@dataclass
class Services:
    """What the browser tools use of a session's services, in the service process."""

    settings: ToolSettings
    browser: BrowserLauncher


class Prompt(Resources):
    """A worker's prompt as the browser tools see it here: the run's settings and its browser context."""

    def __init__(self, services: Services):
        super().__init__()
        self.services = services
        self.released = False

    async def release_all(self) -> None:
        self.released = True
        await super().release_all()


def _main(executable: str, listener: socket.socket, channel) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the run, which stops us after its workers
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(_serve(executable, listener, channel))


async def _serve(executable: str, listener: socket.socket, channel) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # asyncio.run's own
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    browser = BrowserLauncher(executable)
    try:
        try:
            await browser.start()
        except BrowserUnavailable as exc:
            channel.send(str(exc))
            return
        channel.send(None)
        settings = await _receive(channel)
        if not settings.allow_private_urls:  # the guard needs the settings, which come after the launch
            browser.guard = GuardProxy(trusted=settings.trusted_origins)
        services = Services(settings, browser)
        server = await asyncio.start_unix_server(lambda r, w: _client(services, r, w), sock=listener)
        async with server:
            await asyncio.Future()  # until SIGTERM
    finally:
        await browser.close()


async def _receive(channel):
    """The next object from the parent, without blocking the loop (so SIGTERM still stops us)."""
    arrived = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(channel.fileno(), arrived.set)
    try:
        await arrived.wait()
    finally:
        loop.remove_reader(channel.fileno())
    return channel.recv()


async def _client(services: Services, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One worker's connection: its calls run concurrently; its prompts' contexts close when it ends."""
    prompts: dict[int, Prompt] = {}
    running: set[asyncio.Task] = set()
    try:
        while (message := await read_frame(reader)) is not None:
            task = asyncio.create_task(_answer(services, prompts, message, writer))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for prompt in prompts.values():
            await prompt.release_all()
        writer.close()


async def _answer(services: Services, prompts: dict[int, Prompt], message: dict, writer: asyncio.StreamWriter):
    if message.get("release"):
        prompt = prompts.pop(message["prompt"], None)
        if prompt is not None:
            await prompt.release_all()
        result = {}
    else:
        prompt = prompts.setdefault(message["prompt"], Prompt(services))
        result = await _call(prompt, message["tool"], message["arguments"])
        if prompt.released:  # the prompt ended while this call ran: nothing it opened may stay open
            await prompt.release_all()
    if not writer.is_closing():
        writer.write(frame({"id": message["id"], "result": result}))


async def _call(prompt: Prompt, name: str, arguments: dict) -> dict:
    """As tools.call_tool runs a tool: every problem becomes an error result (the worker checked the arguments)."""
    tool = TOOLS.get(name)
    if tool is None:
        return {"error": f"unknown browser tool {name!r}"}
    try:
        return await tool(prompt, **arguments)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
