"""The browser toolset driving the machine's Chromium through Playwright against a local page with a form."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import time

import psutil
import pytest
from tool_session import call, tool_session

from trajforge.tools.browser.runtime import launch, launch_problem
from trajforge.tools.browser.service import STOP_GRACE as SERVICE_STOP_GRACE
from trajforge.tools.browser.service import browser_service
from trajforge.tools.browser.snapshot import SNAPSHOT_LIMIT
from trajforge.tools.session import ToolSession
from trajforge.tools.settings import ToolSettings, find_browser
from trajforge.tools.toolsets import available_toolsets

CHROMIUM = find_browser(os.environ)
PROBLEM = launch_problem(CHROMIUM)
needs_chromium = pytest.mark.skipif(PROBLEM is not None, reason=f"no browser can be launched here: {PROBLEM}")


def ref(snapshot: dict, element: str) -> str:
    """The ref a snapshot gives `element` (role and name, e.g. 'button "Greet me"'), as a model reads it."""
    return re.search(rf"- {re.escape(element)} \[ref=(\w+)\]", snapshot["snapshot"]).group(1)


def playwright_drivers(process: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a short-lived child may be gone already
            if "run-driver" in child.cmdline():
                found.append(child)
    return found


@needs_chromium
def test_navigate_read_type_click_and_see_the_result(site):
    async def scenario(session):
        steps = {"navigate": await call(session, "browser_navigate", url=f"{site.url}/form.html")}
        form = steps["snapshot"] = await call(session, "browser_snapshot")
        steps["type"] = await call(session, "browser_type", ref=ref(form, 'textbox "Your name"'), text="Ada")
        steps["click"] = await call(session, "browser_click", ref=ref(form, 'button "Greet me"'))
        steps["result"] = await call(session, "browser_snapshot")
        steps["stale"] = await call(session, "browser_click", ref=ref(form, 'button "Greet me"'))
        steps["bad"] = await call(session, "browser_click", ref="button")
        steps["back"] = await call(session, "browser_back")
        steps["scroll"] = await call(session, "browser_scroll", direction="down")
        steps["sideways"] = await call(session, "browser_scroll", direction="left")
        again = await call(session, "browser_snapshot")  # the refs of the first snapshot went with its page
        field = ref(again, 'textbox "Your name"')
        steps["typed_enter"] = await call(session, "browser_type", ref=field, text="Bo", submit=True)
        steps["press"] = await call(session, "browser_press", key="Tab")
        steps["bad_key"] = await call(session, "browser_press", key="NoSuchKey")
        greeted = await call(session, "browser_snapshot")
        steps["link"] = await call(session, "browser_click", ref=ref(greeted, 'link "Read about tide pools"'))
        steps["article"] = await call(session, "browser_snapshot")
        steps["close"] = await call(session, "browser_close")
        steps["close_again"] = await call(session, "browser_close")
        steps["fresh"] = await call(session, "browser_back")
        return steps

    steps = asyncio.run(run_in_session(scenario))
    form = f"{site.url}/form.html"
    assert steps["navigate"] == {"url": form, "title": "Greeter", "status": 200}
    assert steps["snapshot"]["snapshot"] == (
        "- generic [active] [ref=e1]:\n"
        '  - heading "Greeter" [level=1] [ref=e2]\n'
        "  - paragraph [ref=e3]: Tell us your name.\n"
        "  - generic [ref=e4]:\n"
        "    - text: Your name\n"
        '    - textbox "Your name" [ref=e5]\n'
        '    - button "Greet me" [ref=e6]\n'
        '  - link "Read about tide pools" [ref=e7] [cursor=pointer]:\n'
        "    - /url: /article.html\n"
        "  - paragraph"
    )
    assert steps["type"] == {"url": form, "title": "Greeter", "typed": "e5"}
    assert steps["click"] == {"url": f"{form}?name=Ada", "title": "Greeter", "clicked": "e6"}
    assert steps["result"]["snapshot"].endswith("- paragraph [ref=f1e8]: Hello, Ada!")
    assert steps["stale"] == {
        "error": "LookupError: no element e6 on the page now; call browser_snapshot for fresh refs"
    }
    assert steps["bad"]["error"].startswith("ValueError: 'button' is not a ref")
    assert steps["back"] == {"url": form, "title": "Greeter"}
    assert steps["scroll"]["at_bottom"] is True and steps["scroll"]["scroll_y"] == 0
    assert steps["sideways"] == {"error": 'direction must be "down" or "up"'}
    assert steps["typed_enter"]["url"] == f"{form}?name=Bo"
    assert steps["press"]["pressed"] == "Tab"
    assert steps["bad_key"]["error"].startswith("Keyboard.press: Unknown key")
    assert steps["link"]["url"] == f"{site.url}/article.html"
    assert '- heading "Life in tide pools" [level=1]' in steps["article"]["snapshot"]
    assert (steps["close"], steps["close_again"]) == ({"closed": True}, {"closed": False})
    assert steps["fresh"] == {"error": "there is no previous page"}  # a fresh context has no history


@needs_chromium
def test_a_long_page_is_cut_with_a_marker(site):
    paragraphs = "".join(f"<p>Paragraph {i}: the quick brown fox jumps over the lazy dog.</p>" for i in range(600))

    async def scenario(session):
        await call(session, "browser_navigate", url=f"{site.url}/form.html")
        context = await session.resource("browser", None)
        await context.pages[-1].set_content(f"<body>{paragraphs}</body>")
        return await call(session, "browser_snapshot")

    text = asyncio.run(run_in_session(scenario))["snapshot"]
    body, marker = text.rsplit("\n", 1)
    assert len(body) == SNAPSHOT_LIMIT
    assert body.startswith('- generic [active] [ref=e1]:\n  - paragraph [ref=e2]: "Paragraph 0: the quick')
    assert re.fullmatch(r"\[\.\.\. \d+ more characters of the page cut \.\.\.\]", marker)


async def run_in_session(scenario):
    async with tool_session(browser_executable=CHROMIUM, allow_private_urls=True) as session:  # local pages
        return await scenario(session)


@needs_chromium
def test_each_prompt_has_its_own_context_closed_with_the_prompt(site):
    async def scenario():
        async with tool_session(browser_executable=CHROMIUM, allow_private_urls=True) as first:
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


@needs_chromium
def test_workers_share_the_run_s_browser_service_and_each_prompt_has_its_own_context(site):
    async def scenario(address):
        async with (  # the second is another worker
            tool_session(browser_endpoint=address, allow_private_urls=True) as first,
            tool_session(browser_endpoint=address, allow_private_urls=True) as second,
        ):
            third = ToolSession(second.env, second.services)  # another prompt of the second worker
            await call(first, "browser_navigate", url=f"{site.url}/form.html")
            opened = await call(second, "browser_navigate", url=f"{site.url}/article.html")
            fresh = await call(third, "browser_back")
            await first.services.close()  # what the end of a worker does
            back = await call(second, "browser_back")
            return opened, fresh, back, [await call(second, "browser_close") for _ in range(2)]

    async def after_the_run(address):
        async with tool_session(browser_endpoint=address) as session:
            return await call(session, "browser_snapshot")

    with browser_service(CHROMIUM) as service:
        address = service.ready(ToolSettings("v", "i", browser_executable=CHROMIUM, allow_private_urls=True))
        opened, fresh, back, closed = asyncio.run(scenario(address))
        drivers = [driver.ppid() for driver in playwright_drivers(psutil.Process())]
    assert opened["title"] == "Tide pools"
    assert fresh == {"error": "there is no previous page"}  # its own context, without the other's history
    assert back == {"url": "about:blank", "title": ""}  # the other worker's end left this context open
    assert closed == [{"closed": True}, {"closed": False}]
    assert drivers == [service.process.pid]  # one Playwright driver, the service's
    gone = asyncio.run(after_the_run(address))
    assert gone["error"].startswith("BrowserUnavailable: the run's browser could not be reached")


@needs_chromium
@pytest.mark.parametrize("stop", ["ctrl_c", "kill_9", "kill_a_worker"])
def test_the_run_s_browser_goes_with_the_run(run, server, stop):
    server.latency = 0.2
    proc = subprocess.Popen(
        run.command(
            [{"prompt": f"browse {i}"} for i in range(6)],
            "--distribution=browser_only",
            "--allow_private_urls",  # the scripted model browses its own server's page, on 127.0.0.1
            batch_size=2,
        ),
        cwd=run.tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(server.requests) < 4 and time.monotonic() < deadline:  # both workers are browsing
        time.sleep(0.02)
    runner = psutil.Process(proc.pid)
    drivers = playwright_drivers(runner)
    assert len(drivers) == 1  # one Playwright driver for the run, not one per worker: the browser service's
    service = drivers[0].parent()
    browser = [service, *service.children(recursive=True)]
    assert any("chromium" in p.name() for p in browser)
    if stop == "kill_a_worker":
        worker = next(p for p in runner.children() if p.pid != service.pid and "python" in p.name())
        browser += worker.children(recursive=True)
        worker.kill()
    else:
        os.killpg(proc.pid, signal.SIGINT if stop == "ctrl_c" else signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == {"ctrl_c": 130, "kill_9": -signal.SIGKILL, "kill_a_worker": 1}[stop]
    _, alive = psutil.wait_procs(browser, timeout=30)
    assert alive == []


def test_a_chromium_that_runs_but_cannot_start_a_browser_stops_the_run_before_any_request(
    run, server, tmp_path, monkeypatch
):
    fake = tmp_path / "chromium"  # answers --version, as a Chromium missing what its browser needs does
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && echo Chromium 1 && exit 0\necho "no display here" >&2\nexit 1')
    fake.chmod(0o755)
    monkeypatch.setenv("BROWSER_EXECUTABLE", str(fake))
    result = run([{"prompt": "x"}], "--distribution=browser_only")
    assert result.code == 2
    assert result.stderr == f"error: the browser toolset: {fake} could not be launched: no display here\n"
    assert server.requests == []


def test_no_browser_means_the_toolset_is_not_offered(tmp_path):
    missing = tmp_path / "no-chromium"
    assert launch_problem(str(missing)).startswith(f"{missing} could not be launched: ")
    offered, unavailable = available_toolsets(ToolSettings("v", "i", browser_executable=None), ["browser"])
    assert offered == {}
    (item,) = unavailable
    assert (item.toolset, item.tool) == ("browser", None)
    assert item.reason == "no Chromium found: install it (apt-get install chromium) or set BROWSER_EXECUTABLE"


@needs_chromium
@pytest.mark.parametrize("when", ["driver_starting", "driver_starting_cancelled_twice", "chromium_starting"])
def test_a_launch_cancelled_midway_leaves_no_playwright_driver_and_no_launcher_folder(tmp_path, monkeypatch, when):
    """A prompt's timeout (a worker that launches its own browser) or the service's SIGTERM cancels a launch:
    while Playwright's driver starts (a driver slow to start, so that the cancel lands there), or while
    Chromium starts (one that never says it is listening). Cancelled twice (a prompt's timeout, then the
    worker's SIGTERM), the launch stops waiting, and the start's driver still goes once it has started."""
    hanging = tmp_path / "chromium"
    hanging.write_text("#!/bin/sh\nexec sleep 60\n")
    hanging.chmod(0o755)
    if when.startswith("driver_starting"):
        slow_driver(tmp_path, monkeypatch, 2)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    me = psutil.Process()

    def running() -> bool:
        if when.startswith("driver_starting"):
            return bool(playwright_drivers(me))
        return any(p.name() == "sleep" for d in playwright_drivers(me) for p in d.children(recursive=True))

    async def cancelled_midway():
        task = asyncio.ensure_future(launch(str(hanging)))
        deadline = time.monotonic() + 30
        while not running() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if when.startswith("driver_starting"):  # its pipes connected, Playwright waiting for it (it sleeps 2 s first)
            await asyncio.sleep(0.5)
        assert not task.done()
        task.cancel()
        if when == "driver_starting_cancelled_twice":
            await asyncio.sleep(0.3)  # the launch waits for the start to end, to stop what it started
            assert not task.done()
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 10
        while playwright_drivers(me) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return playwright_drivers(me)

    assert asyncio.run(cancelled_midway()) == []
    assert list(temporary.glob("batch-runner-browser-*")) == []


def slow_driver(tmp_path, monkeypatch, seconds: float):
    """Playwright's driver starts `seconds` late (a loaded machine, as slow as it gets)."""
    from playwright._impl._driver import compute_driver_executable

    slow = tmp_path / "node"
    slow.write_text(f'#!/bin/sh\nsleep {seconds}\nexec {compute_driver_executable()[0]} "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setenv("PLAYWRIGHT_NODEJS_PATH", str(slow))
    return slow


@needs_chromium
@pytest.mark.parametrize("driver_start", ["quick", "longer_than_the_service_waits"])
def test_the_service_stopped_while_its_playwright_driver_starts_leaves_no_launcher_folder(
    tmp_path, monkeypatch, driver_start
):
    """The run stops the service (SIGTERM) while it starts Playwright; past its STOP_GRACE it is killed."""
    slow = slow_driver(tmp_path, monkeypatch, 1 if driver_start == "quick" else SERVICE_STOP_GRACE + 2)
    temporary = pathlib.Path(tempfile.mkdtemp(dir="/tmp"))  # short: the service's socket is made there too
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # the service, forked, makes its folders there
    try:
        with browser_service(CHROMIUM) as service:
            deadline = time.monotonic() + 30
            while not playwright_drivers(psutil.Process(service.process.pid)) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
        assert service.process.exitcode == (0 if driver_start == "quick" else -signal.SIGKILL)
        assert list(temporary.glob("batch-runner-browser-*")) == []
    finally:  # the killed service's driver, still starting, exits once it reads the end of its pipe
        for process in psutil.process_iter(["cmdline"]):
            if str(slow) in (process.info["cmdline"] or []):
                with contextlib.suppress(psutil.Error):
                    process.kill()
        shutil.rmtree(temporary)
