"""--tools (trajforge/own_tools.py): a Python file's public functions are a toolset offered to every sample,
a plain function of its arguments beside one that gets the sample's session; their results in the
trajectory, their counts in tool_stats (zeros where not called); run.json keeps the file's digest and a
resume with a changed file is refused; a file that cannot be a toolset stops the run before any request,
naming the file and the function."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import tool_results

SHOP = Path(__file__).parent / "plugins" / "shop_tools.py"
FLAGS = ("--distribution=terminal_only", "--environment=local")


def call(tool: str, /, **arguments) -> str:
    return f"{tool}:{quote(json.dumps(arguments), safe='')}"


def entries() -> list[dict]:
    both = f"{call('price_of', item='pear', quantity=2)},{call('shelf', name='fruit')}"
    return [
        {"prompt": f"[mock call={both}] price and shelf", "files": {"shelves/fruit": "apples, pears\n"}},
        {"prompt": f"[mock call={call('price_of', item='kiwi')}] kiwi?"},
        {"prompt": "[mock calls=1] no shop tool"},  # the plan: one built-in tool per turn
    ]


def test_a_tools_file_s_functions_are_called_counted_and_kept_with_its_digest(run_here, server, tmp_path):
    shop = tmp_path / "shop_tools.py"
    shutil.copy(SHOP, shop)
    result = run_here(entries(), f"--tools={shop}", *FLAGS)
    assert result.code == 0, result.stdout + result.stderr
    rows = sorted(result.trajectories, key=lambda row: row["prompt_index"])
    assert len({tuple(row["tool_stats"]) for row in rows}) == 1  # the same keys in every row
    both, kiwi, idle = rows
    assert '"cents": 10' in tool_results(both) and "apples, pears" in tool_results(both)
    assert both["tool_stats"]["price_of"] == {"count": 1, "success": 1, "failure": 0}
    assert both["tool_stats"]["shelf"] == {"count": 1, "success": 1, "failure": 0}
    assert kiwi["tool_stats"]["price_of"] == {"count": 1, "success": 0, "failure": 1}
    assert kiwi["tool_error_counts"]["price_of"] == 1 and "we sell no kiwi" in tool_results(kiwi)
    assert idle["tool_stats"]["price_of"] == {"count": 0, "success": 0, "failure": 0}
    for row in rows:  # offered to every sample besides the distribution's draw; nothing else of the file
        assert row["toolsets_used"] == ["file", "shop_tools", "terminal"]
        system = row["conversations"][0]["value"]
        assert '"name": "price_of"' in system and '"name": "shelf"' in system and "what to buy" in system
        assert '"join"' not in system and "_discount" not in system and '"session"' not in system
    assert not {"join", "_discount"} & set(both["tool_stats"])
    kept = json.loads((result.run_dir / "run.json").read_text())["tools"]
    assert kept == [{"path": str(shop), "sha256": kept[0]["sha256"]}] and kept[0]["sha256"].startswith("sha256:")
    # A resume goes on with the same file; once it changed, a resume is refused naming it.
    sent = len(server.chat_requests())
    assert run_here(entries(), "--resume").code == 0 and len(server.chat_requests()) == sent
    shop.write_text(shop.read_text().replace("PRICES = {", "PRICES = {'kiwi': 9, "))
    refused = run_here(entries(), "--resume")
    assert refused.code == 2 and "--tools" in refused.stderr and str(shop) in refused.stderr
    assert len(server.chat_requests()) == sent


BROKEN = {
    "syntax": ("def price(item: str)\n    return 1\n", "line 1: SyntaxError"),
    "empty": ("from os.path import join\n\n\ndef _private() -> int:\n    return 1\n", "defines no public function"),
    "no_schema": ("def send(when: object) -> dict:\n    return {}\n", "send cannot be a tool"),
    "sync_session": ("def look(session, path: str) -> str:\n    return path\n", "look takes the session"),
    "clash": ("def terminal(command: str) -> str:\n    return command\n", "tool 'terminal' is in two toolsets"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_tools_file_that_cannot_be_a_toolset_stops_the_run_naming_it(run_here, server, tmp_path, kind):
    text, said = BROKEN[kind]
    tools = tmp_path / f"{kind}_tools.py"
    tools.write_text(text)
    result = run_here([{"prompt": "hello"}], f"--tools={tools}", *FLAGS)
    assert result.code == 2, result.stderr
    assert said in result.stderr and tools.name in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not server.chat_requests()


def test_exports_with_a_tools_file_s_tools_render_through_the_chat_templates(run_here, server, tmp_path):
    templates = pytest.importorskip("test_chat_templates")  # skips without transformers
    result = run_here(entries(), f"--tools={SHOP}", *FLAGS, "--export=openai")
    assert result.code == 0, result.stdout + result.stderr
    rows = templates.load([result.run_dir / "export" / "openai.jsonl"], "openai", tmp_path / "cache")
    records = result.trajectories  # in the export's order
    assert rows.num_rows == len(records) == 3
    for row in rows:
        assert {"price_of", "shelf"} <= {tool["function"]["name"] for tool in row["tools"]}
    for family in templates.FAMILIES:
        for row, record in zip(rows, records, strict=True):
            written = templates.recorded_calls(record)
            assert templates.calls_of(row["messages"]) == written
            text = templates.render(family, row["messages"], row["tools"])
            templates.check_rendered(family, text, row["messages"], row["tools"], written)
            assert "what to buy" in text  # the parameter's description, from the docstring


HUGE = '''def huge() -> dict:
    """A result of 5 MB."""
    return {"data": "x" * 5_000_000, "end": "the tail"}


def loud() -> dict:
    """An error whose message is 5 MB."""
    raise ValueError("y" * 5_000_000 + " the end")


def small() -> dict:
    """An honest result."""
    return {"data": "ok"}
'''


def test_a_tools_function_s_huge_result_or_error_reaches_the_model_capped(run_here, server, tmp_path):
    """A result or an error of any size was kept whole (in every later request and the record); now both
    are capped at 100,000 bytes, head and tail kept with a marker, beside an honest result kept as it is."""
    tools = tmp_path / "huge_tools.py"
    tools.write_text(HUGE)
    result = run_here(
        [{"prompt": f"[mock call={call('huge')},{call('loud')},{call('small')}]"}], f"--tools={tools}", *FLAGS
    )
    assert result.code == 0, result.stdout + result.stderr
    (row,) = result.trajectories
    results = tool_results(row)
    assert len(results) < 250_000 and results.count("bytes of output omitted") == 2
    assert "the tail" in results and "the end" in results  # the tails kept
    assert '"content": {"data": "ok"}' in results and row["tool_stats"]["loud"]["failure"] == 1
    assert row["tool_stats"]["huge"] == {"count": 1, "success": 1, "failure": 0}
    assert max(len(json.dumps(request)) for request in server.chat_requests()) < 300_000
