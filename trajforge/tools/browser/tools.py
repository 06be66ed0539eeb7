"""The browser toolset: a real headless Chromium, one browser context per prompt (see runtime.py).

The model reads a page with browser_snapshot and acts on the refs it lists (e1, e2, ...). Each tool runs
where the worker's browser is: in this process, or in the run's browser service (service.py).
"""

from __future__ import annotations

import contextlib
import functools
from typing import cast
from urllib.parse import urlsplit

from trajforge.tools.browser.guard import BLOCKED_HEADER
from trajforge.tools.browser.runtime import BrowserLauncher, launch_problem
from trajforge.tools.browser.snapshot import element, snapshot
from trajforge.tools.netguard import Blocked, check_url
from trajforge.tools.session import ToolSession
from trajforge.tools.settings import ToolSettings

try:
    from playwright.async_api import Error as PlaywrightError
except ImportError:  # launchable() says so; no browser tool is offered then

    class PlaywrightError(Exception):  # type: ignore[no-redef]
        pass


SETTLE_TIMEOUT_MS = 5_000


def launchable(settings: ToolSettings) -> dict[str, str]:
    problem = launch_problem(settings.browser_executable)
    return {"browser": problem} if problem else {}


def _browser_tool(function):
    """Run the tool where the session's browser is; Playwright errors carry a long call log, of which the
    model needs the first line."""

    @functools.wraps(function)
    async def here(session: ToolSession, **arguments) -> dict:
        try:
            return await function(session, **arguments)
        except PlaywrightError as exc:
            return {"error": (str(exc).strip().splitlines() or [type(exc).__name__])[0]}

    @functools.wraps(function)
    async def tool(session: ToolSession, **arguments) -> dict:
        return await session.services.browser.run(session, here, arguments)

    return tool


def _launcher(session: ToolSession) -> BrowserLauncher:
    """Where pages are this process's own: a worker's launcher, or the service's (a client hands the call over)."""
    return cast(BrowserLauncher, session.services.browser)


async def _page(session: ToolSession):
    context = await session.resource("browser", _launcher(session).new_context)
    # The newest page: a link that opened a tab is where the model's attention goes.
    return context.pages[-1] if context.pages else await context.new_page()


async def _settle(page) -> None:
    """Let a navigation that an action started finish loading, without waiting on one that never comes."""
    with contextlib.suppress(PlaywrightError):
        await page.wait_for_load_state("domcontentloaded", timeout=SETTLE_TIMEOUT_MS)


async def _where(page) -> dict:
    title = ""
    with contextlib.suppress(PlaywrightError):
        title = await page.title()
    return {"url": page.url, "title": title}


@_browser_tool
async def browser_navigate(session: ToolSession, url: str) -> dict:
    """Open a web page in the browser. Then call browser_snapshot to read it and get element refs.

    Args:
        url: the http or https address to open
    """
    if urlsplit(url).scheme not in ("http", "https"):
        return {"error": f"only http and https URLs can be opened, not {url!r}"}
    settings = session.services.settings
    try:
        await check_url(url, settings.allow_private_urls, trusted=settings.trusted_origins)
    except Blocked as exc:
        return {"error": str(exc)}
    except OSError as exc:  # the name does not resolve
        return {"error": f"could not resolve the host of {url}: {exc}"}
    page = await _page(session)
    failed = []  # requests that did not complete: a refused tunnel (https) is one

    def note(request) -> None:
        failed.append(request)

    page.on("requestfailed", note)
    try:
        response = await page.goto(url, wait_until="domcontentloaded")
    except PlaywrightError:
        reason = _refused_navigation(session, page, failed)
        if reason:
            return {"error": reason}
        raise
    finally:
        page.remove_listener("requestfailed", note)
    guard = _launcher(session).guard
    if guard is not None and response is not None and response.headers.get(BLOCKED_HEADER.lower()):
        # A plain http hop refused: the guard's own word, never the body, since a site can send the header
        # too, with a body of any size.
        reason = guard.refusal(response.url)
        if reason:
            return {"error": reason}
    return await _where(page) | {"status": response.status if response else None}


def _refused_navigation(session: ToolSession, page, failed: list) -> str | None:
    """The `blocked: ...` reason of a navigation whose tunnel the guard refused, e.g. after a redirect."""
    guard = _launcher(session).guard
    for request in reversed(failed):
        if guard is not None and request.frame is page.main_frame and request.is_navigation_request():
            return guard.refusal(request.url)
    return None


@_browser_tool
async def browser_snapshot(session: ToolSession) -> dict:
    """Read the current page as its accessibility tree: headings, text, and each link, button and form
    field with a ref (like e3) for browser_click and browser_type. Take a new snapshot after the page changes."""
    page = await _page(session)
    return await _where(page) | {"snapshot": await snapshot(page)}


@_browser_tool
async def browser_click(session: ToolSession, ref: str) -> dict:
    """Click a link, button or other element of the page.

    Args:
        ref: the element's ref from the latest browser_snapshot, e.g. e3
    """
    page = await _page(session)
    await (await element(page, ref)).click()
    await _settle(page)
    return await _where(page) | {"clicked": ref}


@_browser_tool
async def browser_type(session: ToolSession, ref: str, text: str, submit: bool = False) -> dict:
    """Type text into a form field, replacing what it held.

    Args:
        ref: the field's ref from the latest browser_snapshot, e.g. e2
        text: the text to enter
        submit: press Enter afterwards (submits most forms)
    """
    page = await _page(session)
    field = await element(page, ref)
    await field.fill(text)
    if submit:
        await field.press("Enter")
        await _settle(page)
    return await _where(page) | {"typed": ref}


@_browser_tool
async def browser_scroll(session: ToolSession, direction: str = "down") -> dict:
    """Scroll the page by about one screen.

    Args:
        direction: "down" or "up"
    """
    if direction not in ("down", "up"):
        return {"error": 'direction must be "down" or "up"'}
    page = await _page(session)
    position = await page.evaluate(
        """(sign) => {
            window.scrollBy(0, sign * window.innerHeight * 0.9);
            return {y: Math.round(window.scrollY), height: document.documentElement.scrollHeight, view: innerHeight};
        }""",
        1 if direction == "down" else -1,
    )
    at_bottom = position["y"] + position["view"] >= position["height"] - 2
    return await _where(page) | {"scroll_y": position["y"], "page_height": position["height"], "at_bottom": at_bottom}


@_browser_tool
async def browser_back(session: ToolSession) -> dict:
    """Go back to the previous page of the browser history."""
    page = await _page(session)
    before = page.url
    response = await page.go_back(wait_until="domcontentloaded")
    if response is None and page.url == before:
        return {"error": "there is no previous page"}
    return await _where(page)


@_browser_tool
async def browser_press(session: ToolSession, key: str) -> dict:
    """Press a key in the page, on the focused element.

    Args:
        key: a key or combination, e.g. Enter, Tab, Escape, ArrowDown, PageDown, End, Control+A
    """
    page = await _page(session)
    await page.keyboard.press(key)
    await _settle(page)
    return await _where(page) | {"pressed": key}


@_browser_tool
async def browser_close(session: ToolSession) -> dict:
    """Close the browser with its cookies and history; the next browser tool opens a fresh one."""
    return {"closed": await session.release("browser")}


# The toolset, in the order the model sees it (registry.TOOLSETS); the browser service runs them by name.
TOOLS = (
    browser_navigate,
    browser_snapshot,
    browser_click,
    browser_type,
    browser_scroll,
    browser_back,
    browser_press,
    browser_close,
)
