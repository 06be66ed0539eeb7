"""Chromium through Playwright: one browser context per prompt (its own cookies, storage and history),
closed when the prompt ends.

With local worker processes the run starts one Chromium for all of them (`shared_browser`, in the
parent, behind Playwright's browser server) and each worker connects to it on first use; elsewhere
(Ray tasks, tests) a worker launches its own, once.

The browser is the machine's Chromium (Debian's package); Playwright's own browser download is never used.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import json
import re
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from trajforge.tools.browser_guard import GuardProxy

try:
    from playwright.async_api import Error as PlaywrightError
except ImportError:  # launch() says so; no browser tool is offered then

    class PlaywrightError(Exception):
        pass


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
    "--no-sandbox",  # we run as root in containers, where Chromium's sandbox cannot start
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
ACTION_TIMEOUT_MS = 10_000
NAVIGATION_TIMEOUT_MS = 30_000
STOP_GRACE = 5.0  # seconds the browser server gets to close Chromium after SIGTERM
PR_SET_PDEATHSIG = 1
_prctl = getattr(ctypes.CDLL(None), "prctl", None)  # looked up before fork: the child only calls it


class BrowserUnavailable(Exception):
    pass


def launch_problem(executable: str | None) -> str | None:
    """Why no browser can be launched on this machine, or None: Playwright is installed and the
    executable runs (`--version`: a tenth of a second, where a launch costs a second and a half)."""
    if executable is None:
        return "no Chromium found: install it (apt-get install chromium) or set BROWSER_EXECUTABLE"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright)"
    try:
        done = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{executable} could not be launched: {exc}"
    if done.returncode:
        return f"{executable} could not be launched: {_last_line(done.stderr) or f'exit status {done.returncode}'}"
    return None


@contextlib.contextmanager
def shared_browser(executable: str) -> Iterator[str]:
    """One headless Chromium for every worker of the run, behind Playwright's browser server; yields
    the address `launch()` connects to. Each connection sees only the contexts it made, and they close
    when it goes (a killed worker leaves nothing open). The server and its Chromium stop when the block
    ends, however it ends, and die with this process if it is killed."""
    from playwright._impl._driver import compute_driver_executable, get_driver_env  # what `playwright` runs

    options = {"executablePath": executable, "args": LAUNCH_ARGS, "timeout": LAUNCH_TIMEOUT_MS}
    with tempfile.TemporaryDirectory(prefix="trajforge-browser-") as folder:
        config, log = Path(folder, "server.json"), Path(folder, "server.log")
        config.write_text(json.dumps(options | {"host": "127.0.0.1", "port": 0}))
        node, cli = compute_driver_executable()
        with log.open("wb") as errors:
            server = subprocess.Popen(
                [node, cli, "launch-server", "--browser", "chromium", "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=get_driver_env(),
                text=True,
                start_new_session=True,  # Ctrl-C goes to the run, which closes the workers' contexts first
                preexec_fn=_die_with_parent,  # Chromium goes with the server: it reads the server's pipe
            )
        try:
            endpoint = server.stdout.readline().strip()  # a random path: only who is told can connect
            if not endpoint.startswith("ws://"):
                server.wait()
                reason = _server_failure(log.read_text(errors="replace")) or f"exit status {server.returncode}"
                raise BrowserUnavailable(f"{executable} could not be launched: {reason}")
            yield endpoint
        finally:
            _stop(server)


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM: the server closes Chromium; SIGKILL if that takes too long (Chromium sees its pipe close)."""
    server.terminate()
    try:
        server.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the runner dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _server_failure(log: str) -> str:
    """The line of a failed server's log (a Node.js stack trace around the browser's own output) that
    says why: the browser's last error line, else the error's message."""
    said = re.findall(r"^\[pid=\d+\]\[err\] (.+)$", log, re.M)
    error = re.search(r"^\w*Error: (.+)$", log, re.M)
    return said[-1].strip() if said else error.group(1).strip() if error else _last_line(log)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


async def launch(executable: str | None, endpoint: str | None = None):
    """(playwright, browser): connected to the run's shared browser at `endpoint`, else a browser of
    our own started with the machine's Chromium; BrowserUnavailable says why not."""
    if executable is None and endpoint is None:
        raise BrowserUnavailable("no Chromium found: install it (apt-get install chromium) or set BROWSER_EXECUTABLE")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        raise BrowserUnavailable("the playwright package is not installed (pip install playwright)") from None
    playwright = await async_playwright().start()
    try:
        if endpoint:
            browser = await playwright.chromium.connect(endpoint, timeout=LAUNCH_TIMEOUT_MS)
        else:
            browser = await playwright.chromium.launch(
                executable_path=executable, headless=True, args=LAUNCH_ARGS, timeout=LAUNCH_TIMEOUT_MS
            )
    except PlaywrightError as exc:
        await playwright.stop()
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if endpoint:
            raise BrowserUnavailable(f"the run's browser could not be reached: {first_line}") from None
        raise BrowserUnavailable(f"{executable} could not be launched: {first_line}") from None
    return playwright, browser


class BrowserLauncher:
    """A worker's browser: connected or launched on first use, again if it went away."""

    def __init__(self, executable: str | None, endpoint: str | None = None, guard: GuardProxy | None = None):
        self.executable = executable
        self.endpoint = endpoint
        self.guard = guard  # every request of our contexts goes through it; None: --allow_private_urls
        self._playwright = None
        self._browser = None
        self._lock = asyncio.Lock()

    async def new_context(self):
        """A fresh browser context for one prompt."""
        async with self._lock:
            if self._browser is None or not self._browser.is_connected():
                await self._shutdown()
                self._playwright, self._browser = await launch(self.executable, self.endpoint)
            # `<-loopback>` drops Chromium's implicit bypass of localhost and 127.0.0.1: they are guarded too.
            proxy = {"server": await self.guard.start(), "bypass": "<-loopback>"} if self.guard else None
        context = await self._browser.new_context(
            viewport={"width": 1280, "height": 900}, accept_downloads=False, proxy=proxy
        )
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
        return context

    async def close(self) -> None:
        """Our own browser stops; a shared one only loses our connection and the contexts we made."""
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
