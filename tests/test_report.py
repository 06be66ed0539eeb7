"""report.html (trajforge/export/report.py): the embedding and the sample in-process, then the page of a
real run opened from disk in headless Chromium with every request that is not a file refused.

REPORT_SCREENSHOT=docs/report.png makes the browser test save its screenshot there (the README's; the path
is relative to the checkout)."""

from __future__ import annotations

import json
import os
import re

import pytest
from conftest import ROOT, sample_of, source

from trajectory import ToolCall, Turn
from trajforge.export.report import ReportData, embed
from trajforge.journal.sample import Sample
from trajforge.tools.browser.runtime import LAUNCH_ARGS, launch_problem
from trajforge.tools.settings import find_browser
from trajforge.verification.result import unverified

TOOLS = ["--distribution=terminal_only"]
CHROMIUM = find_browser(os.environ)
PROBLEM = launch_problem(CHROMIUM)
SCRIPT_PAYLOAD = "</script><script>window.pwned = 1; alert('script')</script> close the data block"
IMG_PAYLOAD = "<img src=x onerror=\"window.pwned = 2; alert('img')\"> <!-- & \u2028 -->"


def test_embedded_json_cannot_end_its_script_block_and_reads_back_the_same():
    data = {"text": [SCRIPT_PAYLOAD, IMG_PAYLOAD, "<!--", "a & b", "\u2029"]}
    embedded = embed(data)
    for raw in (b"<", b">", b"&", "\u2028".encode(), "\u2029".encode()):
        assert raw not in embedded
    assert json.loads(embedded) == data


def sample(index: int, discarded: bool = False) -> tuple[Sample, str | None]:
    turns = [Turn("done", "" if discarded else "why", [ToolCall(f"c{index}", "terminal", "{}", {"output": "x"})])]
    finished = sample_of(
        prompt_index=index,
        entry={"prompt": f"prompt {index}\nmore"},
        turns=turns,
        tool_names=["terminal"],
        usage={"total_tokens": 3},
        verification=unverified(),
        duration_seconds=float(index),
    )
    return finished, "no_reasoning" if discarded else None


def collect(samples, limit: int) -> ReportData:
    collected = ReportData(limit)
    for record, verdict in samples:
        collected.observe(record, verdict)
    return collected


def test_the_browser_gets_the_discarded_first_then_the_same_sample_whatever_the_order():
    samples = [sample(i, discarded=i % 6 == 0) for i in range(30)]
    forward, backward = collect(samples, 10), collect(reversed(samples), 10)
    shown = forward.trajectories()
    assert [t["prompt_index"] for t in shown[:5]] == [0, 6, 12, 18, 24] and not any(t["kept"] for t in shown[:5])
    assert all(t["kept"] for t in shown[5:]) and len(shown) == 10
    assert shown == backward.trajectories()
    assert forward.total == 30 and sum(forward.charts({})["durations"]["counts"]) == 30  # charts cover all
    assert collect(samples, 0).trajectories() == []


def test_report_false_writes_no_report(run_here):
    result = run_here([{"prompt": "plain"}], *TOOLS, "--report=false")
    assert result.code == 0 and not (result.run_dir / "report.html").exists()
    assert (result.run_dir / "README.md").exists()


@pytest.fixture
def hostile_run(run_here):
    """Trajectories whose prompt, reasoning, answer and tool results carry markup, parallel calls, a
    sample dropped for want of reasoning, and a prompt that fails (errors.jsonl)."""
    prompts = ["plain task", SCRIPT_PAYLOAD, IMG_PAYLOAD, "[mock calls=3] parallel", "[mock reasoning=none] silent"]
    result = run_here([{"prompt": p} for p in [*prompts, "[mock fail=400] refused"]], *TOOLS)
    assert result.code == 4, result.stdout + result.stderr  # the refused prompt failed for good
    return result


@pytest.mark.skipif(PROBLEM is not None, reason=f"no browser can be launched here: {PROBLEM}")
def test_the_report_opens_from_disk_and_shows_the_run(hostile_run, tmp_path):
    from playwright.sync_api import sync_playwright

    stats = hostile_run.statistics
    # Lines split on "\n" only: str.splitlines() would also split at the U+2028 of IMG_PAYLOAD.
    lines = b"".join(path.read_bytes() for path in sorted(hostile_run.run_dir.glob("batch_*.jsonl")))
    finished = [json.loads(line) for line in lines.split(b"\n") if line.strip()]
    refused, errors, dialogs = [], [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})

            def only_files(route) -> None:
                if route.request.url.startswith("file:"):
                    route.continue_()
                else:
                    refused.append(route.request.url)
                    route.abort()

            page.route("**/*", only_files)
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto((hostile_run.run_dir / "report.html").as_uri())
            page.wait_for_selector("#list li")

            # Without any click: the run's name and the first line of every prompt the page holds.
            assert page.locator("#run-name").inner_text() == "run"
            shown = page.locator("#list .first-line").all_inner_texts()
            for record in finished:
                first = source(record)["prompt"].splitlines()[0].strip()
                assert any(text.endswith(first) for text in shown), first
            assert page.locator("#failed-list .first-line").all_inner_texts() == ["#5 [mock fail=400] refused"]
            assert "Showing 5 of 5 finished samples" in page.locator("#shown-note").inner_text()
            # A histogram's bars say their range, and its marks are its edges: the last one, the largest value,
            # is drawn whole inside the chart.
            chart = page.locator("svg", has=page.locator("rect.bar title", has_text="–")).first
            titles = chart.locator("rect.bar title").all_text_contents()
            assert titles and all(re.match(r"^[\d.]+–[\d.]+ s: \d+$", title) for title in titles), titles
            box, last = chart.bounding_box(), chart.locator("text.tick").last
            assert last.text_content() == titles[-1].split("–")[1].split(" ")[0] + " s"
            mark = last.bounding_box()
            assert box["x"] <= mark["x"] and mark["x"] + mark["width"] <= box["x"] + box["width"] + 0.5

            # The counts are statistics.json's.
            for key in ("total_prompts", "trajectories", "completed", "partial", "failed", "discarded_no_reasoning"):
                assert page.locator(f'[data-stat="{key}"]').inner_text() == str(stats[key]), key
            assert stats["failed"] == 1 and stats["discarded_no_reasoning"] == 1

            # Filtering by a tool leaves exactly the trajectories that called it.
            used = {r["prompt_index"]: {t for t, e in r["tool_stats"].items() if e["count"]} for r in finished}
            options = page.locator("#filter-tool option").all_inner_texts()[1:]
            assert "terminal" in options
            for tool in options:
                page.select_option("#filter-tool", tool)
                visible = page.locator("#list li:not([hidden]) .first-line").all_inner_texts()
                indices = {int(re.match(r"#(\d+)", text).group(1)) for text in visible}
                assert indices == {index for index, tools in used.items() if tool in tools}, tool
            page.select_option("#filter-tool", "")

            # Opening a trajectory shows each tool call beside its result, matched by id.
            page.locator("#list li button").filter(has_text="parallel").click()
            pairs = page.locator("#detail .call-pair")
            assert pairs.count() >= 3
            for n in range(pairs.count()):
                call, result = pairs.nth(n).locator(".call"), pairs.nth(n).locator(".result")
                assert call.locator(".call-id").inner_text() == result.locator(".call-id").inner_text()
                left, right = call.bounding_box(), result.bounding_box()
                assert right["x"] >= left["x"] + left["width"] and abs(right["y"] - left["y"]) < 2
            assert page.locator("#detail details.reasoning").first.get_attribute("open") is None  # folded

            # The hostile texts are text: shown as written, nothing ran, nothing loaded.
            page.locator("#list li button").filter(has_text="close the data block").click()
            assert SCRIPT_PAYLOAD in page.locator("#detail pre.prompt").inner_text()
            page.locator("#list li button").filter(has_text="onerror").click()
            assert "<img src=x onerror=" in page.locator("#detail pre.prompt").inner_text()
            assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0
            screenshot = (
                ROOT / os.environ["REPORT_SCREENSHOT"] if "REPORT_SCREENSHOT" in os.environ else tmp_path / "x.png"
            )
            page.locator("#list li button").filter(has_text="plain task").click()
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    assert errors == [] and dialogs == [] and refused == []
