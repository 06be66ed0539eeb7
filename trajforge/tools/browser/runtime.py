"""Chromium through Playwright: one browser context per prompt (its own cookies, storage and history),
closed when the prompt ends.

With local worker processes the run's browser service (service.py) launches one Chromium for
all of them and runs their browser tools; elsewhere (Ray tasks, tests) a worker launches its own, once.

The browser is the machine's Chromium (Debian's package); Playwright's own browser download is never used.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import importlib.util
import re
import signal
import subprocess
from collections.abc import Awaitable, Callable

from trajforge.tools.browser.guard import GuardProxy
from trajforge.tools.browser.sandbox import SandboxedBrowser

# Chromium takes only the last --disable-features it is given, so ours repeats the features that
# Playwright's launch() disables (as of 1.65) and adds two: without them every browser context, so
# every prompt, gets a window whose omnibox popup is a web page of its own, a renderer process that
# costs as much CPU as the prompt's page.
PLAYWRIGHT_DISABLED_FEATURES = (
    "AvoidUnnecessaryBeforeUnloadCheckSync,DestroyProfileOnBrowserClose,HttpsUpgrades,"
    "HttpsFirstBalancedModeAutoEnable,LensOverlay,MediaRouter,PaintHolding,ThirdPartyStoragePartitioning,"
    "AvoidCorsURLLoaderRestartOnRedirect,OptimizationHints,NetworkTimeServiceQuerying,AimEnabled,PreconnectToSearch"
)
LAUNCH_ARGS = [
    "--no-sandbox",  # in bwrap, which is the sandbox; dropped where Chromium's own runs (sandbox.py)
    "--disable-gpu",
    "--disable-dev-shm-usage",  # /dev/shm is tiny in containers
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--mute-audio",
    # WebRTC sends UDP (STUN, media) from Chromium itself, past the guard proxy, to any address a page
    # names; this keeps it to what can go through a proxy.
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    f"--disable-features={PLAYWRIGHT_DISABLED_FEATURES},WebUIOmniboxPopup,WebUIOmniboxAimPopup",
]
LAUNCH_TIMEOUT_MS = 30_000
STOP_GRACE = 10.0  # seconds a cancelled launch waits for Playwright's start, then its stop, to end
ACTION_TIMEOUT_MS = 10_000
NAVIGATION_TIMEOUT_MS = 30_000
PR_SET_PDEATHSIG = 1
_prctl = getattr(ctypes.CDLL(None), "prctl", None)  # looked up before fork: the child only calls it


class BrowserUnavailable(Exception):
    pass


@functools.cache
def launch_problem(executable: str | None) -> str | None:
    """Why no browser can be launched on this machine, or None: Playwright is installed and the
    executable runs (`--version`: a tenth of a second, where a launch costs a second and a half).
    Asked once per process and executable: the run's helpers ask it while the runner imports."""
    if executable is None:
        return "no Chromium found: install it (apt-get install chromium) or set BROWSER_EXECUTABLE"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright)"
    try:
        done = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{executable} could not be launched: {exc}"
    if done.returncode:
        return f"{executable} could not be launched: {(_lines(done.stderr) or [f'exit status {done.returncode}'])[-1]}"
    return None


def die_with_parent() -> None:
    """In a child process: SIGKILL when the runner dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _launch_failure(error: str) -> str:
    """Why a launch failed: the browser's last error line in Playwright's log, else the error's first line."""
    said = re.findall(r"^\[pid=\d+\]\[err\] (.+)$", error, re.M)
    return said[-1].strip() if said else (_lines(error) or ["no reason given"])[0]


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


async def launch(executable: str | None):
    """(playwright, browser) started with the machine's Chromium; BrowserUnavailable says why not."""
    if executable is None:
        raise BrowserUnavailable("no Chromium found: install it (apt-get install chromium) or set BROWSER_EXECUTABLE")
    try:  # here, not at the top: the package takes a quarter second that batch_runner.py's start does without
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import async_playwright
    except ImportError:
        raise BrowserUnavailable("the playwright package is not installed (pip install playwright)") from None
    # A launch is cancelled by the service's SIGTERM, or by a prompt's timeout in a worker that launches its own
    # browser: its Playwright driver goes however this ends, and its launcher's folder too. The folder is made once
    # Playwright runs: a service killed while waiting for a slow start (its STOP_GRACE) leaves nothing behind.
    started = await _started(async_playwright())
    playwright = started.result()
    try:
        sandboxed = SandboxedBrowser(executable, LAUNCH_ARGS)
    except BaseException as exc:
        await _stopped(started)
        if isinstance(exc, PermissionError):
            raise BrowserUnavailable(str(exc)) from None
        raise
    try:
        browser = await playwright.chromium.launch(
            executable_path=sandboxed.executable, headless=True, args=sandboxed.args, timeout=LAUNCH_TIMEOUT_MS
        )
    except BaseException as exc:  # cancelled too: the driver goes, and with it the Chromium it was starting
        await _stopped(started)
        if isinstance(exc, PlaywrightError):
            raise BrowserUnavailable(f"{executable} could not be launched: {_launch_failure(str(exc))}") from None
        raise
    finally:
        sandboxed.close()
    return playwright, browser


_STOPPING: set[asyncio.Future] = set()  # stops going on after their caller was cancelled (the loop keeps weak refs)


async def _started(manager) -> asyncio.Future:
    """Playwright's start by `manager`, done (its driver running): what _stopped is given. A start cancelled half
    way leaves its driver running, and Playwright keeps nothing of it to stop it by: cancelled meanwhile, the
    start goes on and what it started is stopped when it ends (see _stopped)."""
    starting = asyncio.ensure_future(manager.start())
    try:
        await asyncio.shield(starting)
        return starting
    except asyncio.CancelledError:
        await _stopped(starting)
        raise


async def _stopped(starting: asyncio.Future) -> None:
    """The Playwright that `starting` gives is stopped, once it has it: waited for at most STOP_GRACE seconds,
    no longer once cancelled (again: CancelledError, in place of what the caller raises, so that a cancel is never
    lost); the stop goes on meanwhile, however long the start takes."""
    stopping = asyncio.ensure_future(_stop_when_started(starting))
    _STOPPING.add(stopping)
    stopping.add_done_callback(_STOPPING.discard)
    await asyncio.wait({stopping}, timeout=STOP_GRACE)  # cancelled, it does not cancel `stopping`


async def _stop_when_started(starting: asyncio.Future) -> None:
    await asyncio.wait({starting})
    if not starting.cancelled() and starting.exception() is None:  # a start that failed started nothing
        with contextlib.suppress(Exception):
            await starting.result().stop()


class BrowserLauncher:
    """A browser of our own: launched on first use (or at `start()`), again if it went away. The browser
    tools run where it is (`run`)."""

    def __init__(self, executable: str | None, guard: GuardProxy | None = None):
        self.executable = executable
        self.guard = guard  # every request of our contexts goes through it; None: --allow_private_urls
        self._playwright = None
        self._browser = None
        self._lock = asyncio.Lock()

    async def run(self, session, function: Callable[..., Awaitable[dict]], arguments: dict) -> dict:
        """The result of browser tool `function` called for `session`'s prompt, here."""
        return await function(session, **arguments)

    async def start(self) -> None:
        """Launch the browser now rather than on first use; BrowserUnavailable says why it cannot be."""
        async with self._lock:
            await self._launched()

    async def _launched(self):
        if self._browser is None or not self._browser.is_connected():
            await self._shutdown()
            self._playwright, self._browser = await launch(self.executable)
        return self._browser

    async def new_context(self):
        """A fresh browser context for one prompt."""
        async with self._lock:
            browser = await self._launched()
            # `<-loopback>` drops Chromium's implicit bypass of localhost and 127.0.0.1: they are guarded too.
            proxy = {"server": await self.guard.start(), "bypass": "<-loopback>"} if self.guard else None
        context = await browser.new_context(
            viewport={"width": 1280, "height": 900}, accept_downloads=False, proxy=proxy
        )
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
        return context

    async def close(self) -> None:
        """The browser stops, and the guard with it."""
        async with self._lock:
            await self._shutdown()
            if self.guard is not None:
                await self.guard.close()

    async def _shutdown(self) -> None:
        browser, playwright = self._browser, self._playwright
        self._browser = self._playwright = None
        if browser is not None:
            with contextlib.suppress(Exception):
                await browser.close()
        if playwright is not None:
            with contextlib.suppress(Exception):
                await playwright.stop()
