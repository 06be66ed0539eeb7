"""Plugins (trajforge/registry.py, trajforge/plugins.py): a file outside the package registers a toolset, a
distribution, an export format and a verifier kind, and a run uses all four through --plugins; the same
through an installed package's entry point; a plugin that cannot be loaded stops the run before any request,
naming its file and line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import quote

import pytest

from trajforge import plugins

ORDERS = Path(__file__).parent / "plugins" / "orders_plugin.py"


@pytest.fixture
def run_here(run_here):
    """Runs in this process (a refused run costs no start of Python): a run loads its --plugins into this
    process's registry, which holds the built-ins alone again after the test, as conftest left it."""
    yield run_here
    plugins.load()


def call(name: str, **arguments) -> str:
    return f"{name}:{quote(json.dumps(arguments), safe='')}"


def test_a_plugin_file_s_toolset_distribution_export_and_check_are_used_by_a_run(run, server):
    entries = [
        {
            "prompt": f"[mock call={call('lookup_order', order_id='A1')}] Where is A1?",
            "verify": {"mentions": "shipped"},
        },
        {
            "prompt": f"[mock call={call('lookup_order', order_id='boom')}] Where is boom?",
            "verify": {"mentions": "shipped"},
        },
    ]
    flags = (f"--plugins={ORDERS}", "--distribution=support", "--export=order_lines,openai")
    result = run(entries, *flags)
    assert result.code == 0, result.stderr
    rows = sorted(result.trajectories, key=lambda row: row["prompt_index"])
    assert len(rows) == 2
    keys = {tuple(row["tool_stats"]) for row in rows}
    assert len(keys) == 1  # the same keys in every row: the plugin's tools beside every built-in one
    (names,) = keys
    assert {"lookup_order", "cancel_order", "terminal", "browser_navigate"} <= set(names)
    found, broken = rows
    assert found["tool_stats"]["lookup_order"] == {"count": 1, "success": 1, "failure": 0}
    assert found["tool_stats"]["cancel_order"] == {"count": 0, "success": 0, "failure": 0}  # offered, not called
    assert broken["tool_stats"]["lookup_order"] == {"count": 1, "success": 0, "failure": 1}
    assert broken["tool_error_counts"]["lookup_order"] == 1
    assert "the order service is down" in broken["conversations"][3]["value"]  # the tool error the model read
    assert found["toolsets_used"] == ["orders"] and "lookup_order" in found["conversations"][0]["value"]
    # The verifier kind decided both: the answer quotes the tool's result, or the error.
    verified = [row["metadata"]["verification"] for row in rows]
    assert [(v["passed"], v["reward"]) for v in verified] == [(True, 1.0), (False, 0.25)]
    assert verified[0]["output"] == "looked for 'shipped' in the final answer"
    # Its export beside a built-in one, listed in the card.
    lines = [json.loads(line) for line in (result.run_dir / "export" / "orders.jsonl").read_text().splitlines()]
    assert sorted(line["called"] for line in lines) == [["lookup_order"], ["lookup_order"]]
    assert {line["run"] for line in lines} == {"run"}
    assert (result.run_dir / "export" / "openai.jsonl").exists()
    assert "export/orders.jsonl" in (result.run_dir / "README.md").read_text()
    assert json.loads((result.run_dir / "run.json").read_text())["plugins"] == [str(ORDERS)]
    # A resume without the flag loads them again from run.json, re-merges the same rows, sends nothing.
    sent = len(server.chat_requests())
    again = run(entries, "--resume", "--export=order_lines")
    assert again.code == 0, again.stderr
    assert len(server.chat_requests()) == sent
    assert [row["tool_stats"] for row in again.trajectories] == [row["tool_stats"] for row in result.trajectories]
    assert (result.run_dir / "export" / "orders.jsonl").read_text().count("\n") == 2


def test_a_resume_with_other_plugins_is_refused(run, server, tmp_path):
    entries = [{"prompt": f"[mock call={call('lookup_order', order_id='A1')}] Where?"}]
    assert run(entries, f"--plugins={ORDERS}", "--distribution=support").code == 0
    other = tmp_path / "other.py"
    other.write_text("def register(registry):\n    pass\n")
    refused = run(entries, "--resume", f"--plugins={other}")
    assert refused.code == 2 and "--plugins" in refused.stderr


BROKEN = {
    "syntax": ("def register(registry)\n    pass\n", "line 1: SyntaxError"),
    "raises": (
        "X = 1\n\n\ndef register(registry):\n    raise ValueError('no database')\n",
        "line 5: ValueError: no database",
    ),
    "nothing": ("TOOLS = []\n", "defines no register(registry) function"),
    "clash": (
        "async def run(session) -> dict:\n    return {}\n\n\ndef register(registry):\n"
        "    registry.toolset('terminal', [run])\n",
        "toolset 'terminal' is registered by both built-in and --plugins",
    ),
    "tool_clash": (
        "async def terminal(session, command: str) -> dict:\n    return {}\n\n\ndef register(registry):\n"
        "    registry.toolset('shell2', [terminal])\n",
        "tool 'terminal' is in two toolsets: 'terminal' (built-in) and 'shell2' (--plugins",
    ),
    "no_schema": (
        "async def send(session, when: object) -> dict:\n    return {}\n\n\ndef register(registry):\n"
        "    registry.toolset('mail', [send])\n",
        "toolset 'mail' (--plugins",
    ),
    "bad_percent": (
        "def register(registry):\n    registry.distribution('odd', {'terminal': 150})\n",
        "distribution 'odd': 'terminal' needs a percent 0-100",
    ),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_plugin_that_cannot_be_loaded_stops_the_run_naming_it(run_here, server, tmp_path, kind):
    text, said = BROKEN[kind]
    plugin = tmp_path / f"{kind}_plugin.py"
    plugin.write_text(text)
    result = run_here([{"prompt": "hello"}], f"--plugins={plugin}", "--distribution=terminal_only")
    assert result.code == 2, result.stderr
    assert said in result.stderr and (kind in ("clash", "bad_percent") or str(plugin.name) in result.stderr)
    assert result.stderr.count("\n") == 1 and not server.chat_requests()  # one line, no request


def test_names_a_plugin_registers_are_unknown_without_it(run_here, server):
    result = run_here([{"prompt": "hello"}], "--distribution=support")
    assert result.code == 2 and "--distribution" in result.stderr and "support" in result.stderr
    result = run_here([{"prompt": "hello"}], "--export=order_lines")
    assert result.code == 2 and "unknown format 'order_lines'" in result.stderr
    result = run_here([{"prompt": "hello", "verify": {"mentions": "x"}}])
    assert result.code == 2 and "unknown check(s) 'mentions'" in result.stderr
    assert not server.chat_requests()


def test_a_plugin_s_check_refuses_a_bad_value_at_load(run_here, server):
    result = run_here([{"prompt": "hello", "verify": {"mentions": 3}}], f"--plugins={ORDERS}")
    assert result.code == 2 and '"verify.mentions" must be a non-empty string' in result.stderr
    assert not server.chat_requests()


def test_list_distributions_shows_a_plugin_s(tmp_path):
    shown = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "batch_runner.py"),
            "--list_distributions",
            f"--plugins={ORDERS}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert shown.returncode == 0, shown.stderr
    assert "support" in shown.stdout and "orders 100%" in shown.stdout


PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "br-plugin-weather"
        version = "0.1"

        [project.entry-points."batch_runner.plugins"]
        weather = "br_plugin_weather"
        """,
    "br_plugin_weather/__init__.py": '''
        async def forecast(session, city: str) -> dict:
            """The weather tomorrow.

            Args:
                city: where
            """
            return {"city": city, "forecast": "sunny"}


        def register(registry):
            registry.toolset("weather", [forecast])
            registry.distribution("weather_only", {"weather": 100})
        ''',
}


def test_an_installed_package_s_entry_point_registers_without_a_flag(run, server, tmp_path):
    source = tmp_path / "package"
    for name, text in PACKAGE.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(textwrap.dedent(text).lstrip())
    target = tmp_path / "site"  # installed here, on this run's path only: not for the other tests' runs
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            f"--target={target}",
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    os.environ["PYTHONPATH"] = str(target)
    try:
        result = run(
            [{"prompt": f"[mock call={call('forecast', city='Oslo')}] Weather?"}], "--distribution=weather_only"
        )
    finally:
        del os.environ["PYTHONPATH"]
    assert result.code == 0, result.stderr
    (row,) = result.trajectories
    assert row["tool_stats"]["forecast"] == {"count": 1, "success": 1, "failure": 0}
    assert "sunny" in row["conversations"][3]["value"]


def test_a_distribution_file_draws_the_toolsets_it_names_a_plugin_s_too(run, server, tmp_path):
    chances = tmp_path / "support.json"
    chances.write_text(json.dumps({"orders": 1, "terminal": 0.5, "web": 0}))
    entries = [{"prompt": f"[mock call={call('lookup_order', order_id=f'A{i}')}] Where is A{i}?"} for i in range(6)]
    result = run(entries, f"--plugins={ORDERS}", f"--distribution={chances}", "--seed=7")
    assert result.code == 0, result.stderr
    drawn = [row["toolsets_used"] for row in result.trajectories]
    assert all("orders" in used and "web" not in used for used in drawn)  # probability 1 and 0
    assert {"terminal" in used for used in drawn} == {True, False}  # 0.5: some samples each way (seed 7)
    assert json.loads((result.run_dir / "run.json").read_text())["distribution"] == str(chances)
    listed = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "batch_runner.py"),
            "--list_distributions",
            f"--plugins={ORDERS}",
            f"--distribution={chances}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "orders 100%" in listed.stdout and "terminal 50%" in listed.stdout


@pytest.mark.parametrize("text", ['{"terminal": 2}', "[1]", "{}", '{"terminal": true}', "not json"])
def test_a_bad_distribution_file_stops_the_run_naming_it(run_here, server, tmp_path, text):
    chances = tmp_path / "odd.json"
    chances.write_text(text)
    result = run_here([{"prompt": "hello"}], f"--distribution={chances}")
    assert result.code == 2 and "--distribution" in result.stderr and "odd.json" in result.stderr
    assert not server.chat_requests()
