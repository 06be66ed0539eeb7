"""The run's helper processes: the scripted model's server (--model=mock, on 127.0.0.1, for this run
only) and the browser service (one Chromium for every local worker: tools/browser/service.py).

batch_runner.py starts them as soon as the flags are read, before it imports the rest of the runner
(about 2 s, most of it the openai package), so that they come up on the other core meanwhile. A run
that turns out to have nothing to do, or a toolset that is not available after all, just stops them.
signal_handlers_kept() gives back the signal handlers a run changed, once its helpers have stopped too.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from toolset_distributions import weights
from trajforge.errors import SetupError
from trajforge.runconfig import RunConfig
from trajforge.tools.browser.runtime import BrowserUnavailable, launch_problem

if TYPE_CHECKING:  # imported when a run offers the browser: its tools import the playwright package
    from trajforge.tools.browser.service import BrowserService


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Put back SIGINT's and SIGTERM's handlers once the run and its helpers are done. A run that stops
    early ignores both while it finishes up (the helpers' stop included); main() may be called again in
    this process (the tests do). Only a changed one is set: signal.signal works on the main thread only.
    Within it SIGINT is Ctrl-C whatever this process inherited: a shell starts a script's `cmd &` with
    SIGINT ignored, and the run would not stop for it."""
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    if handlers[signal.SIGINT] == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for number, handler in handlers.items():
            if signal.getsignal(number) != handler:
                signal.signal(number, handler)


class Helpers:
    """Started when made; stopped on leaving its `with`, however the run ends."""

    def __init__(self, config: RunConfig):
        self.mock: subprocess.Popen | None = None
        self.browser: BrowserService | None = None
        if config.mock:
            self.mock = subprocess.Popen(
                [sys.executable, "-m", "trajforge.mock.server", "--port", "0", "--exit_with_stdin"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        # Ray tasks may run on other machines: each launches a browser of its own.
        executable = config.tools.browser_executable  # None: no browser toolset is offered
        if config.executor == "pool" and weights(config.distribution).get("browser") and executable:
            from trajforge.tools.browser.service import BrowserService

            try:
                self.browser = BrowserService(executable)
            except BaseException:  # no `with` holds us yet: the mock server must not outlive this
                self.stop()
                raise
            # Whether the toolset is available (`chromium --version`) is asked meanwhile too, off the main thread.
            threading.Thread(target=launch_problem, args=(config.tools.browser_executable,), daemon=True).start()

    @property
    def serves_the_model(self) -> bool:
        """The endpoint is the mock server started here: it printed its address once it was listening."""
        return self.mock is not None

    def ready(self, config: RunConfig, browser: bool) -> RunConfig:
        """`config` pointed at the helpers once they are up: the mock server's endpoint and, when the run
        offers the browser, the service's address."""
        if self.mock is not None:
            assert self.mock.stdout is not None  # a pipe
            line = self.mock.stdout.readline().strip()
            if not line.startswith("MOCK_SERVER_URL="):
                raise RuntimeError(f"the mock server did not start (it printed {line!r})")
            url = line.split("=", 1)[1]
            # The mock model sends its tools to its own pages: the one loopback origin URL checks let through.
            tools = replace(config.tools, trusted_origins=frozenset({urlsplit(url).netloc}))
            config = replace(config, model=replace(config.model, base_url=url, cache_as="mock"), tools=tools)
        if browser and self.browser is not None:
            try:
                address = self.browser.ready(config.tools)
            except BrowserUnavailable as exc:
                raise SetupError(f"the browser toolset: {exc}") from None
            config = replace(config, tools=replace(config.tools, browser_endpoint=address))
        return config

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def release(self) -> None:
        """The run needs them no more: they stop while it merges and reports (stop() waits for them)."""
        if self.browser is not None:
            self.browser.terminate()
        if self.mock is not None:
            self.mock.kill()

    def stop(self) -> None:
        self.release()
        if self.browser is not None:
            self.browser.stop()
        if self.mock is not None:
            self.mock.wait()
