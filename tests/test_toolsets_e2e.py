"""Whole runs of batch_runner.py where the scripted model uses every toolset: what is offered, what is
left out (and said so once), the summary's tool table, and the tools' own tokens in the run's usage.
They run through its entry point in this process (`run_here`); the workers fork from here."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import run_cli, tool_results

from toolset_distributions import ALL_SIX
from trajforge.mock import model as mock_model
from trajforge.model.usage import add_usage, empty_usage
from trajforge.tools.browser.runtime import launch_problem
from trajforge.tools.settings import find_browser
from trajforge.tools.toolsets import by_toolset, every_tool

BROWSER_PROBLEM = launch_problem(find_browser(os.environ))
MODELS = ["--vision_model=vision-test", "--image_model=image-test"]


def offered_tools(record: dict) -> set[str]:
    system = record["conversations"][0]["value"]
    return {t["name"] for t in json.loads(re.search(r"<tools>\n(.*)\n</tools>", system, re.S).group(1))}


def tool_table(stdout: str) -> dict[str, tuple[int, int, int]]:
    """tool -> (calls, success, failure), read from the summary's table."""
    rows = re.findall(r"│ (\w+) +│ +(\d+) │ +(\d+) │ +(\d+) │", stdout)
    return {name: tuple(map(int, numbers)) for name, *numbers in rows}


def replayed_usage(server) -> dict:
    """The usage of every request the server answered, recomputed from the scripted model."""
    site = f"http://127.0.0.1:{server.port}"
    total = empty_usage()
    for request in server.requests:
        if request["path"].endswith("/chat/completions"):
            add_usage(total, mock_model.reply(request["body"], 0, None, site)[0].usage)
        else:
            add_usage(total, mock_model.image_reply(request["body"], site)["usage"])  # input_tokens, output_tokens
    return total


@pytest.mark.skipif(BROWSER_PROBLEM is not None, reason=f"no browser can be launched here: {BROWSER_PROBLEM}")
def test_default_distribution_offers_and_exercises_every_toolset(run_here, server, site, monkeypatch):
    monkeypatch.setenv("WEB_SEARCH_URL", site.url)
    entries = [
        {"prompt": f"Greet the form at {site.url}/form.html and read about tide pools"},
        {"prompt": "Look around the page"},
    ]
    result = run_here(
        entries, "--distribution=default", *MODELS, "--allow_private_urls", "--num_workers=2", batch_size=1
    )
    assert result.code == 0, result.stdout + result.stderr
    assert "warning" not in result.stderr  # every toolset is available

    offered = {t.name for toolset in ALL_SIX for t in by_toolset()[toolset]}
    exercised = offered - {"patch", "search_files"}  # the mock model edits no file in place
    for record in result.trajectories:
        assert record["toolsets_used"] == sorted(ALL_SIX) and offered_tools(record) == offered
        assert set(record["tool_stats"]) == set(every_tool())  # every registered tool, execute_code included
        for name in exercised:
            assert record["tool_stats"][name]["success"] >= 1, (name, record["tool_stats"][name])
        assert sum(stats["failure"] for stats in record["tool_stats"].values()) == 0
    table = tool_table(result.stdout)
    assert set(table) == exercised and all(
        calls == success and not failure for calls, success, failure in table.values()
    )

    first, second = sorted(result.trajectories, key=lambda r: r["prompt_index"])
    responses = tool_results(first)
    for seen in ("Result 0 for Greet the form", "Tell us your name.", "Hello, mock!", "(mock vision)", "images/"):
        assert seen in responses  # search results, the page, the form's answer, the vision answer, the saved image
    assert "The mock model's page" in json.dumps(second["conversations"])  # no URL in the prompt: the mock's own page

    models = {(r["path"].rsplit("/", 1)[-1], r["body"]["model"]) for r in server.requests}
    assert models == {("completions", "test-model"), ("completions", "vision-test"), ("generations", "image-test")}
    usage = result.statistics["usage"]
    expected = replayed_usage(server)  # the agent's calls plus those of vision_analyze and image_generate
    assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        k: expected[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    }


def test_without_a_search_provider_web_extract_is_still_offered(run_here, monkeypatch):
    monkeypatch.delenv("WEB_SEARCH_URL", raising=False)
    result = run_here(
        [{"prompt": "read the mock page"}, {"prompt": "again"}],
        "--distribution=minimal",
        *MODELS,
        "--allow_private_urls",
    )
    assert result.code == 0, result.stderr
    assert result.stderr.count("warning:") == 1
    assert (
        "warning: web_search is not available here, so it is not offered: no search provider configured: "
        "set WEB_SEARCH_URL to a SearXNG instance, or TAVILY_API_KEY or BRAVE_API_KEY" in result.stderr
    )
    for record in result.trajectories:
        assert offered_tools(record) == {"web_extract"}
        assert record["tool_stats"]["web_extract"] == {"count": 1, "success": 1, "failure": 0}
        assert record["tool_stats"]["web_search"] == {"count": 0, "success": 0, "failure": 0}


def test_the_code_execution_distribution(run_here):
    result = run_here([{"prompt": "compute something"}], "--distribution=code_execution")
    assert result.code == 0, result.stderr
    (record,) = result.trajectories
    assert record["toolsets_used"] == ["code_execution", "file", "terminal"]
    assert record["tool_stats"]["execute_code"] == {"count": 1, "success": 1, "failure": 0}
    responses = tool_results(record)
    assert '"content": {"stdout": "45\\n", "stderr": "done\\n", "exit_code": 0}' in responses


def test_a_browser_that_cannot_start_is_reported_once_and_left_out(run_here, tmp_path, monkeypatch):
    """Also: the browser service, stopped while Playwright started, leaves no launcher folder behind (two a run)."""
    # The run's and its browser service's (forked from here) temporary folder, no other test's; short, for the
    # service's socket path.
    temporary = Path(tempfile.mkdtemp(prefix="e2e-"))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.setenv("BROWSER_EXECUTABLE", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("WEB_SEARCH_URL", "http://127.0.0.1:9")  # configured, never asked: the mock searches no web
    result = run_here([{"prompt": "browse [mock turns=0]"}], "--distribution=browser_use", *MODELS)
    assert result.code == 0, result.stderr
    assert result.stderr.count("warning: browser") == 1  # (another warning says that no tool was called)
    assert f"warning: browser is not available here, so it is not offered: {tmp_path}/no-chromium could not" in (
        result.stderr.replace("\n", "")
    )
    (record,) = result.trajectories
    assert "browser" not in record["toolsets_used"]
    only_browser = run_here([{"prompt": "x"}], "--distribution=browser_only", run_name="other")
    assert only_browser.code == 2
    assert "none of its toolsets is available here" in only_browser.stderr
    left = list(temporary.glob("batch-runner-browser-*"))
    shutil.rmtree(temporary)
    assert not left


def test_list_distributions_says_what_is_unavailable_and_why(tmp_path, monkeypatch):
    # The README's --list_distributions as a process, with every toolset available: tests/test_smoke.py.
    monkeypatch.delenv("WEB_SEARCH_URL", raising=False)
    monkeypatch.setenv("BROWSER_EXECUTABLE", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("COLUMNS", "200")  # wide enough that no cell wraps
    code, listing, stderr = run_cli(["--list_distributions"])
    assert code == 0, stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in listing.splitlines() if "%" in line}
    assert rows["default"] == (
        "web 100% (partly), vision 100%, image_gen 100%, terminal 100%, file 100%, browser 100% (unavailable)"
    )
    assert rows["terminal_only"] == "terminal 100%, file 100%"
    assert rows["code_execution"] == "code_execution 100%, terminal 100%, file 100%"
    assert "Not available on this machine" in listing
    assert re.search(r"│ web +│ web_search +│ no search provider configured: set WEB_SEARCH_URL", listing)
    assert re.search(rf"│ browser +│ all its tools +│ {tmp_path}/no-chromium could not be launched", listing)


def first_turn_calls(prompt: str, toolsets: list[str]) -> set[str]:
    tools = [tool.schema for toolset in toolsets for tool in by_toolset()[toolset]]
    request = {"model": "mock", "messages": [{"role": "user", "content": prompt}], "tools": tools}
    message = mock_model.reply(request, 0)[0].message
    return {call["function"]["name"] for call in message["tool_calls"]}


@pytest.mark.parametrize(
    ("prompt", "toolsets", "browses"),
    [
        ("Sum the numbers one to ten", ALL_SIX, False),  # a browser context is half a second of CPU: not for this
        ("Browse the Flask documentation", ALL_SIX, True),
        ("Summarise https://example.org/notes", ALL_SIX, True),
        ("What does the login page say?", ALL_SIX, True),
        ("Sum the numbers one to ten", ["browser", "terminal"], True),  # nothing else reads the web
    ],
)
def test_the_mock_model_opens_the_browser_for_a_task_about_a_page(prompt, toolsets, browses):
    calls = first_turn_calls(prompt, toolsets)
    assert ("browser_navigate" in calls) == browses, calls
    assert "terminal" in calls
