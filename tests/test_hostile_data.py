"""No reply and no dataset line can crash a prompt, a merge or the budget (issue 23).

The scripted server sends what a hostile model would (trajforge/mock/model.py: args_deep, args_surrogate,
content_surrogate, body_deep, bad_utf8, usage=KIND), streamed and plain; whole runs go through
batch_runner's entry point in this process (`run_here`), a few prompts per run. Each case asserts the
prompt's outcome, its saved line, what the budget counted against what the server saw, and that a
--resume of the folder re-merges with exit 0, writing every export."""

from __future__ import annotations

import json
import sqlite3

import orjson
import pytest
from conftest import calls, sample_of, source

from trajectory import known_cost
from trajforge import safejson
from trajforge.errors import UsageError
from trajforge.export import atif, card
from trajforge.journal import v1
from trajforge.money.pricing import Prices
from trajforge.money.reply_cost import reply_cost
from trajforge.money.store import FILE_NAME
from trajforge.run.dataset import load_dataset, path_problem

FLAGS = ["--distribution=terminal_only", "--environment=local", "--num_workers=1", "--max_retries=1"]
EXPORTS = "--export=openai,llamafactory,atif,parquet"
EXPORT_FILES = ("openai.jsonl", "llamafactory.json", "atif.jsonl", "trajectories.parquet")
ESCAPED = "\\ud800"  # a lone surrogate as the record keeps it: six characters of text
# prompt -> (the first tool call's arguments as sent, words of the error the model read)
TOOL_ERRORS = {
    "deep args [mock args_deep=300 turns=1]": ("[" * 300, "nested deeper than 200 levels"),
    "very deep args [mock args_deep=50000 turns=1]": ("[" * 50000, "nested deeper than 200 levels"),
    "surrogate args [mock args_surrogate turns=1]": ('"echo \\ud800"', "lone surrogate"),
}
CONTENT = "surrogate content [mock content_surrogate turns=1]"
BAD_REPLIES = ("deep body [mock body_deep=200000 times=2 turns=0]", "bad bytes [mock bad_utf8 times=2 turns=0]")


def stream_flag(stream: bool) -> list[str]:
    return ["--stream"] if stream else []


def asked(server, prompt: str) -> int:
    return sum(r["prompt"] == prompt for r in server.chat_requests())


def ledger(run_dir) -> tuple[int, int]:
    """(paid calls, paid calls of unknown cost), from the money database."""
    with sqlite3.connect(run_dir / FILE_NAME) as db:
        return db.execute("SELECT paid_calls, unknown_calls FROM totals").fetchone()


def assert_everything_loads(run_dir) -> None:
    """Every JSON Lines file of the folder and export/ loads in `datasets`, and the card lists only those."""
    datasets = pytest.importorskip("datasets")
    for path in [*run_dir.glob("*.jsonl"), *run_dir.glob("export/*.jsonl")]:
        assert path.stat().st_size, f"{path.name} is empty"
        assert datasets.load_dataset("json", data_files=str(path), split="train").num_rows
    with sqlite3.connect(run_dir / FILE_NAME) as db:  # a cached reply replays as JSON, never as a crash
        for (blob,) in db.execute("SELECT data FROM replies"):
            orjson.loads(blob)


@pytest.mark.parametrize("stream", [False, True])
def test_every_hostile_reply_ends_as_a_tool_error_or_a_bad_reply_and_the_folder_re_merges(run_here, server, stream):
    entries = [{"prompt": prompt} for prompt in [*TOOL_ERRORS, CONTENT, *BAD_REPLIES]]
    flags = [*FLAGS, "--concurrency=3", EXPORTS, *stream_flag(stream)]
    first = run_here(entries, *flags, batch_size=3)
    assert first.code == 1, first.stdout + first.stderr  # the bad replies failed their prompts: --resume retries
    errors = first.jsonl("errors.jsonl")
    assert sorted(e["error_type"] for e in errors) == ["api_bad_reply", "api_bad_reply"], errors
    lines = {source(line)["prompt"]: line for line in first.batch_lines}
    assert set(lines) == {*TOOL_ERRORS, CONTENT}
    for prompt, (sent, problem) in TOOL_ERRORS.items():
        line = lines[prompt]
        assert line["completed"] and line["tool_stats"]["terminal"]["failure"] == 1
        gpt, tool = line["conversations"][2:4]
        assert sent in calls(gpt)[0]["arguments"]  # the call's arguments kept as the text that came
        assert problem in tool["value"]  # and the model read why they were not run
    content = lines[CONTENT]["conversations"][-1]["value"]
    assert content.endswith(ESCAPED) and lines[CONTENT]["completed"]
    for prompt in BAD_REPLIES:
        assert asked(server, prompt) == 2  # tried twice (--max_retries=1), never paid: no usage could be read
    assert ledger(first.run_dir) == (len(first.batch_lines) * 2, 0)  # two calls per saved prompt

    again = run_here(entries, *flags, "--resume", batch_size=3)
    assert again.code == 0, again.stdout + again.stderr
    assert len(again.batch_lines) == len(entries) and not again.jsonl("errors.jsonl")[len(errors) :]
    for name in ("trajectories.jsonl", "README.md", "report.html", *(f"export/{f}" for f in EXPORT_FILES)):
        assert (again.run_dir / name).is_file(), name
    atif_rows = {row["extra"]["prompt_index"]: row for row in again.jsonl("export/atif.jsonl")}
    deep = atif_rows[0]["steps"][2]["tool_calls"][0]["arguments"]
    assert deep == {safejson.UNPARSED: '{"command": ' + "[" * 300 + "]" * 300 + "}"}
    assert_everything_loads(again.run_dir)
    requests = len(server.chat_requests())
    merged = run_here(entries, *flags, "--resume", batch_size=3)  # nothing left to run: a merge alone
    assert merged.code == 0 and len(server.chat_requests()) == requests
    assert (merged.run_dir / "export/atif.jsonl").read_bytes() == (again.run_dir / "export/atif.jsonl").read_bytes()


@pytest.mark.parametrize("stream", [False, True])
def test_paid_replies_holding_a_lone_surrogate_are_counted_and_the_budget_stops_them(run_here, server, stream):
    """20 prompts of two replies each, every reply $0.01 and holding a lone surrogate, under $0.05."""
    entries = [{"prompt": f"paid {i} [mock content_surrogate cost=0.01 turns=1]"} for i in range(20)]
    flags = [*FLAGS, "--concurrency=1", *stream_flag(stream)]
    first = run_here(entries, *flags, "--max_cost=0.05")
    assert first.code == 3, first.stdout + first.stderr  # the budget stopped the run
    assert len(server.chat_requests()) == 5 and len(first.batch_lines) == 2  # the third prompt stopped midway
    assert first.statistics["budget"]["spent"] == pytest.approx(0.05) and ledger(first.run_dir) == (5, 0)
    assert all(line["conversations"][-1]["value"].endswith(ESCAPED) for line in first.batch_lines)
    again = run_here(entries, *flags, "--max_cost=0.05", "--resume")
    assert again.code == 3 and len(server.chat_requests()) == 5  # nothing paid twice, nothing beyond the budget
    more = run_here(entries, *flags, "--max_cost=1", "--resume")  # the cached reply of the third replays
    assert more.code == 0, more.stdout + more.stderr
    assert len(server.chat_requests()) == 40 and more.statistics["cache"]["hits"] == 2  # once per resume
    assert len(more.batch_lines) == 20 and more.statistics["budget"]["spent"] == pytest.approx(0.4)


@pytest.mark.parametrize("stream", [False, True])
def test_a_paid_reply_that_fails_is_still_counted(run_here, server, stream):
    entries = [{"prompt": "charged [mock upstream_error cost=0.01 times=1 turns=0]"}]
    result = run_here(entries, *FLAGS, "--concurrency=1", "--max_cost=1", *stream_flag(stream))
    assert result.code == 0, result.stdout + result.stderr
    assert len(server.chat_requests()) == 2 and ledger(result.run_dir) == (2, 0)  # the failed one, then the answer
    assert result.statistics["budget"]["spent"] == pytest.approx(0.02)
    assert result.trajectories[0]["metadata"]["usage"]["cost"] == pytest.approx(0.01)  # the prompt's own reply


@pytest.mark.parametrize("kind", ["empty", "huge", "negative", "strings", "list"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_without_usable_usage_has_an_unknown_cost_which_stops_a_budget(run_here, server, kind, stream):
    entries = [{"prompt": f"usage [mock no_cost usage={kind} turns=0]"}, {"prompt": "next [mock no_cost turns=0]"}]
    prices = ["--price_input=1", "--price_output=1"]
    result = run_here(entries, *FLAGS, "--concurrency=1", *prices, "--max_cost=0.0001", *stream_flag(stream))
    assert result.code == 2, result.stdout + result.stderr
    assert len(server.chat_requests()) == 1  # the reply was paid for, blind: nothing more runs
    assert ledger(result.run_dir) == (1, 1) and result.statistics["budget"]["spent"] is None  # unknown, not $0
    # Without a cost limit it is data: a trajectory whose cost is unknown, never $0.
    free = run_here(entries, *FLAGS, "--concurrency=1", *prices, *stream_flag(stream), run_name="free")
    assert free.code == 0 and free.statistics["cost_known"] is False
    by_prompt = {source(r)["prompt"]: known_cost(r["metadata"]["usage"]) for r in free.trajectories}
    assert by_prompt[entries[0]["prompt"]] is None and by_prompt[entries[1]["prompt"]] > 0


def test_usage_beyond_what_the_request_could_produce_is_not_believed():
    prices = Prices(1.0, 2.0)
    good = {"usage": {"prompt_tokens": 1000, "completion_tokens": 10}}
    assert reply_cost(good, prices, request_tokens=50, max_tokens=10) == pytest.approx(1020e-6)
    assert reply_cost(good, prices, request_tokens=9, max_tokens=None) is None  # 1000 > 100 x 9
    assert reply_cost(good, prices, request_tokens=50, max_tokens=9) is None
    assert reply_cost({"usage": {"prompt_tokens": 1, "completion_tokens": 10**7 + 1}}, prices, 50, None) is None
    assert reply_cost({"usage": {"prompt_tokens": 1.5, "completion_tokens": 1}}, prices, 50, None) is None
    assert reply_cost({"usage": {"prompt_tokens": True, "completion_tokens": 1}}, prices, 50, None) is None
    assert reply_cost({"usage": {"cost": 0.5}}, prices, 50, None) == 0.5  # the endpoint's own word is taken
    assert reply_cost({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}, None, 50, None) is None


# -- the writer: what orjson cannot encode is kept as escaped text -------------------------------------------


def test_the_writer_keeps_lone_surrogates_and_values_too_deep_as_text():
    deep: list = []
    for _ in range(300):
        deep = [deep]
    written = orjson.loads(safejson.dumps({"text": "a\ud800b", "\udfff": deep}))
    assert written["text"] == "a\\ud800b" and "\\udfff" in written
    inner = written["\\udfff"]
    for _ in range(safejson.MAX_DEPTH - 1):
        inner = inner[0]
    assert inner == {safejson.UNPARSED: "[" * 102 + "]" * 102}  # 301 lists, 199 of them kept as lists
    with pytest.raises(ValueError, match="nested deeper than 200 levels"):
        safejson.parse("[" * 201 + "]" * 201)
    with pytest.raises(ValueError, match="lone surrogate"):
        safejson.parse('{"command": "echo \\ud800"}')
    assert safejson.parse_lenient('"\\ud800"') == "\\ud800"
    assert safejson.parse_lenient("[1" + "0" * 30 + ', "\\ud800"]') == [str(10**30), "\\ud800"]
    assert safejson.dumps({"n": 10**30}) == b'{"n":"1' + b"0" * 30 + b'"}'


def test_exports_keep_arguments_too_deep_as_text():
    arguments = '{"command": ' + "[" * 300 + "]" * 300 + "}"
    turn = {
        "from": "gpt",
        "value": "<think>\n\n</think>\n",
        "tool_calls": json.dumps([{"id": "a", "name": "terminal", "arguments": arguments}]),
    }
    turns = v1.turns({"conversations": [turn]})
    (call,) = turns[0].calls
    assert json.loads(call.arguments_json()) == arguments  # as a JSON string: nothing lost, nothing too deep
    (step,) = [s for s in atif.steps(sample_of(entry={"prompt": ""}, turns=turns)) if s["source"] == "agent"]
    assert step["tool_calls"][0]["arguments"] == {"_unparsed": arguments}


# -- the dataset: paths the system cannot take are refused at load -------------------------------------------------


def test_cwd_and_image_the_system_cannot_take_are_refused_naming_line_and_field(tmp_path):
    lines = [
        {"prompt": "fine", "cwd": "sub/dir"},
        {"prompt": "nul", "cwd": "a\0b"},
        {"prompt": "long name", "cwd": "x" * 300},
        {"prompt": "deep", "cwd": "/".join(["d"] * 300)},
        {"prompt": "long path", "cwd": "/".join(["y" * 200] * 25)},
        {"prompt": "control", "image": "alpine\n:latest"},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(UsageError) as refused:
        load_dataset(path)
    message = str(refused.value)
    assert "5 bad line(s)" in message and "line 1:" not in message
    assert 'line 2: "cwd" holds a NUL or control character' in message
    assert 'line 3: "cwd" has a name of 300 bytes, more than 255' in message
    assert 'line 4: "cwd" has 300 levels, more than 256' in message
    assert 'line 5: "cwd" is 5024 bytes long, more than 4096' in message
    assert 'line 6: "image" holds a NUL or control character' in message
    assert path_problem("/work/" + "é" * 127) is None and path_problem("é" * 128)


def test_a_bad_cwd_stops_the_run_before_any_request(run_here, server):
    result = run_here([{"prompt": "ok"}, {"prompt": "bad", "cwd": "x" * 300}], *FLAGS)
    assert result.code == 2 and 'line 2: "cwd" has a name of 300 bytes' in result.stdout + result.stderr
    assert server.chat_requests() == []


# -- no empty data file is listed ------------------------------------------------------------------------------


def test_verified_samples_without_a_pair_leave_no_preferences_file(run_here, server):
    entries = [{"prompt": "always passes [mock turns=1]", "verify": "true"}]
    result = run_here(entries, *FLAGS, "--concurrency=1", "--n_samples=2", EXPORTS)
    assert result.code == 0, result.stdout + result.stderr
    assert result.statistics["verification"]["preference_pairs"] == 0
    assert not (result.run_dir / "preferences.jsonl").exists()
    assert "preferences" not in (result.run_dir / "README.md").read_text()
    assert_everything_loads(result.run_dir)


def test_a_card_without_trajectories_lists_no_data_file():
    text = card.render({"run_name": "r", "trajectories": 0}, {}, {"openai": "export/openai.jsonl"}, "1", None)
    header = text.split("---")[1]
    assert "configs:" not in header and "data_files" not in header
