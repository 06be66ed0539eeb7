"""The browser toolset driving the machine's Chromium through Playwright against a local page with a form."""

from __future__ import annotations

import asyncio
import os

import pytest
from tool_session import call, tool_session

from trajforge.tools.browser_runtime import launch_problem
from trajforge.tools.registry import available_toolsets
from trajforge.tools.session import ToolSession
from trajforge.tools.settings import ToolSettings, find_browser

CHROMIUM = find_browser(os.environ)
PROBLEM = launch_problem(CHROMIUM)
needs_chromium = pytest.mark.skipif(PROBLEM is not None, reason=f"no browser can be launched here: {PROBLEM}")


@needs_chromium
def test_navigate_read_type_click_and_see_the_result(site):
    async def scenario(session):
        steps = {"navigate": await call(session, "browser_navigate", url=f"{site.url}/form.html")}
        steps["snapshot"] = await call(session, "browser_snapshot")
        steps["type"] = await call(session, "browser_type", ref="e1", text="Ada")
        steps["click"] = await call(session, "browser_click", ref="e2")
        steps["result"] = await call(session, "browser_snapshot")
        steps["stale"] = await call(session, "browser_click", ref="e9")
        steps["bad"] = await call(session, "browser_click", ref="button")
        steps["back"] = await call(session, "browser_back")
        steps["scroll"] = await call(session, "browser_scroll", direction="down")
        steps["sideways"] = await call(session, "browser_scroll", direction="left")
        await call(session, "browser_snapshot")  # refs are gone with the page they named
        steps["typed_enter"] = await call(session, "browser_type", ref="e1", text="Bo", submit=True)
        steps["press"] = await call(session, "browser_press", key="Tab")
        steps["bad_key"] = await call(session, "browser_press", key="NoSuchKey")
        await call(session, "browser_snapshot")
        steps["link"] = await call(session, "browser_click", ref="e3")
        steps["article"] = await call(session, "browser_snapshot")
        steps["close"] = await call(session, "browser_close")
        steps["close_again"] = await call(session, "browser_close")
        steps["fresh"] = await call(session, "browser_back")
        return steps

    steps = asyncio.run(run_in_session(scenario))
    form = f"{site.url}/form.html"
    assert steps["navigate"] == {"url": form, "title": "Greeter", "status": 200}
    assert steps["snapshot"]["snapshot"] == (
        "# Greeter\nTell us your name.\nYour name\n"
        'textbox "Your name" [ref=e1]\nbutton "Greet me" [ref=e2]\n'
        'link "Read about tide pools" [ref=e3] -> /article.html'
    )
    assert steps["type"] == {"url": form, "title": "Greeter", "typed": "e1"}
    assert steps["click"] == {"url": f"{form}?name=Ada", "title": "Greeter", "clicked": "e2"}
    assert steps["result"]["snapshot"].endswith("Hello, Ada!")
    assert steps["stale"] == {
        "error": "LookupError: no element e9 on the page now; call browser_snapshot for fresh refs"
    }
    assert steps["bad"]["error"].startswith("ValueError: 'button' is not a ref")
    assert steps["back"] == {"url": form, "title": "Greeter"}
    assert steps["scroll"]["at_bottom"] is True and steps["scroll"]["scroll_y"] == 0
    assert steps["sideways"] == {"error": 'direction must be "down" or "up"'}
    assert steps["typed_enter"]["url"] == f"{form}?name=Bo"
    assert steps["press"]["pressed"] == "Tab"
    assert steps["bad_key"]["error"].startswith("Keyboard.press: Unknown key")
    assert steps["link"]["url"] == f"{site.url}/article.html"
    assert "# Life in tide pools" in steps["article"]["snapshot"]
    assert (steps["close"], steps["close_again"]) == ({"closed": True}, {"closed": False})
    assert steps["fresh"] == {"error": "there is no previous page"}  # a fresh context has no history


async def run_in_session(scenario):
    async with tool_session(browser_executable=CHROMIUM) as session:
        return await scenario(session)


@needs_chromium
def test_each_prompt_has_its_own_context_closed_with_the_prompt(site):
    async def scenario():
        async with tool_session(browser_executable=CHROMIUM) as first:
            second = ToolSession(first.env, first.services)  # another prompt of the same worker
            await call(first, "browser_navigate", url=f"{site.url}/form.html?name=first")
            await call(second, "browser_navigate", url=f"{site.url}/article.html")
            first_context = await first.resource("browser", None)
            second_context = await second.resource("browser", None)
            browser = first_context.browser
            shared = browser is second_context.browser and first_context is not second_context
            await second.release("browser")  # what closing the second prompt does
            left = browser.contexts
            back = await call(first, "browser_back")
            return shared, left, first_context, back

    shared, left, first_context, back = asyncio.run(scenario())
    assert shared  # one browser process per worker, one context per prompt
    assert left == [first_context]
    assert back["url"] == "about:blank"  # the first prompt's history holds only its own page


def test_no_browser_means_the_toolset_is_not_offered(tmp_path):
    missing = tmp_path / "no-chromium"
    assert launch_problem(str(missing)).startswith(f"{missing} could not be launched: ")
    offered, unavailable = available_toolsets(ToolSettings("v", "i", browser_executable=None), ["browser"])
    assert offered == {}
    (item,) = unavailable
    assert (item.toolset, item.tool) == ("browser", None)
    assert item.reason == "no Chromium found: install it (apt-get install chromium) or set BROWSER_EXECUTABLE"
