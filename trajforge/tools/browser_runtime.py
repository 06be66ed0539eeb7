"""Chromium through Playwright: one browser process per worker, launched on first use, and one browser
context per prompt (its own cookies, storage and history), closed when the prompt ends.

The browser is the machine's Chromium (Debian's package), driven through `executable_path`; Playwright's
own browser download is never used.
"""

from __future__ import annotations

import asyncio
import contextlib

try:
    from playwright.async_api import Error as PlaywrightError
except ImportError:  # launch() says so; no browser tool is offered then

    class PlaywrightError(Exception):
        pass


LAUNCH_ARGS = [
    "--no-sandbox",  # we run as root in containers, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-dev-shm-usage",  # /dev/shm is tiny in containers
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--mute-audio",
]
LAUNCH_TIMEOUT_MS = 30_000
ACTION_TIMEOUT_MS = 10_000
NAVIGATION_TIMEOUT_MS = 30_000


class BrowserUnavailable(Exception):
    pass


async def launch(executable: str | None):
    """(playwright, browser) started with the machine's Chromium; BrowserUnavailable says why not."""
    if executable is None:
        raise BrowserUnavailable("no Chromium found: install it (apt-get install chromium) or set BROWSER_EXECUTABLE")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        raise BrowserUnavailable("the playwright package is not installed (pip install playwright)") from None
    playwright = await async_playwright().start()
    try:
        browser = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=LAUNCH_ARGS, timeout=LAUNCH_TIMEOUT_MS
        )
    except PlaywrightError as exc:
        await playwright.stop()
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BrowserUnavailable(f"{executable} could not be launched: {first_line}") from None
    return playwright, browser


def launch_problem(executable: str | None) -> str | None:
    """Why no browser can be launched on this machine, or None. Launches one and closes it, so it is
    run once, at start, in the parent process."""

    async def probe() -> None:
        playwright, browser = await launch(executable)
        await browser.close()
        await playwright.stop()

    try:
        asyncio.run(probe())
    except BrowserUnavailable as exc:
        return str(exc)
    return None


class BrowserLauncher:
    def __init__(self, executable: str | None):
        self.executable = executable
        self._playwright = None
        self._browser = None
        self._lock = asyncio.Lock()

    async def new_context(self):
        """A fresh browser context for one prompt; (re)launches the browser if it is not running."""
        async with self._lock:
            if self._browser is None or not self._browser.is_connected():
                await self._shutdown()
                self._playwright, self._browser = await launch(self.executable)
        context = await self._browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=False)
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
        return context

    async def close(self) -> None:
        async with self._lock:
            await self._shutdown()

    async def _shutdown(self) -> None:
        browser, playwright = self._browser, self._playwright
        self._browser = self._playwright = None
        if browser is not None:
            with contextlib.suppress(Exception):
                await browser.close()
        if playwright is not None:
            with contextlib.suppress(Exception):
                await playwright.stop()
