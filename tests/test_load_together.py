"""Outputs load together: any set of trajectories.jsonl files, from runs that did anything, loads in one
`datasets.load_dataset("json", data_files=[...])`, in any order, also a file over 10 MB whose first rows
have no tool call.

`datasets` types each column by the first file (and the first 10 MB chunk of a file) and casts the rest
to it; a value empty or null in one run and typed in another fails the cast one way round. So the checks
are generic: whatever keys a record gains later must keep every row's types the same, and no leaf is
ever null (docs/record.md): an unknown cost, an unverified sample, a verification without error each have
a placeholder of the value's own type and a flag."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import orjson
import pytest
from conftest import sample_of

from trajectory import ToolCall, Turn
from trajforge.model.usage import empty_usage
from trajforge.runfolder.folder import RunFolder
from trajforge.runfolder.merge import merge
from trajforge.verification.result import result, unverified

pa_json = pytest.importorskip("pyarrow.json")
TOOLS = ["read_file", "terminal", "write_file"]
SCHEMA = {"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}


def record(
    entry: dict, turns: list[Turn], exit_reason: str = "completed", cost: float | None = 0.0, verification=None
) -> dict:
    """A record as the worker writes it (orjson, one line), read back: `cost` None when the run had no
    prices, `verification` as verify_sample returns it (unverified by default)."""
    usage = empty_usage() | {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "cost": cost}
    built = sample_of(
        prompt_index=3,
        entry=entry,
        turns=turns,
        tool_schemas=[SCHEMA],
        tool_names=TOOLS,
        exit_reason=exit_reason,
        usage=usage,
        verification=verification or unverified(),
    )
    return orjson.loads(built.trajectory_line())


QUIET = record({"prompt": "hi"}, [Turn("hello", "", finish_reason="stop")])
BUSY_TURNS = [
    Turn("", "plan", [ToolCall("c1", "terminal", '{"command": "ls"}', {"output": "x"})], "tool_calls"),
    Turn("", "", [ToolCall("c2", "nope", "{broken", {"error": "unknown tool"})], "tool_calls"),
    Turn("cut off mid-wo", "more", finish_reason="length"),
]
BUSY = record(
    {"prompt": "work", "id": 7, "answer": {"value": [1, 2]}, "image": "python:3.12"}, BUSY_TURNS, exit_reason="length"
)


def untyped(value, path: str = "") -> list[str]:
    """Paths of values whose Arrow type depends on other rows: null, an empty list or object."""
    if value is None or value == [] or value == {}:
        return [path]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in untyped(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [p for item in value for p in untyped(item, f"{path}[]")]
    return []


def arrow_schema(*records: dict):
    return pa_json.read_json(io.BytesIO(b"".join(orjson.dumps(r) + b"\n" for r in records))).schema


def test_records_of_very_different_runs_have_the_same_arrow_schema():
    assert arrow_schema(QUIET) == arrow_schema(BUSY) == arrow_schema(QUIET, BUSY)
    assert untyped(QUIET) == untyped(BUSY) == []


def test_every_turn_has_the_same_four_string_keys():
    for turn in QUIET["conversations"] + BUSY["conversations"]:
        assert set(turn) == {"from", "value", "tool_calls", "finish_reason"}
        assert all(isinstance(value, str) for value in turn.values())
    gpt = [t for t in BUSY["conversations"] if t["from"] == "gpt"]
    assert [t["finish_reason"] for t in gpt] == ["tool_calls", "tool_calls", "length"]
    assert json.loads(gpt[0]["tool_calls"]) == [{"id": "c1", "name": "terminal", "arguments": '{"command": "ls"}'}]
    assert json.loads(gpt[1]["tool_calls"])[0]["arguments"] == "{broken"  # as the model sent it
    assert [t["tool_calls"] for t in QUIET["conversations"]] == ["[]"] * 3
    assert json.loads(BUSY["metadata"]["source"]) == {
        "prompt": "work",
        "id": 7,
        "answer": {"value": [1, 2]},
        "image": "python:3.12",
    }


def load(files: list[Path], cache: Path):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    return datasets.load_dataset("json", data_files=[str(f) for f in files], split="train", cache_dir=str(cache))


STARTED = time.monotonic()
# What one run's rows may differ in from another's: whether prices were set, whether anything verified
# the samples, whether a verifier broke.
RUNS = {
    "unpriced": {"cost": None},
    "priced": {"cost": 0.0125},
    "unverified": {},
    "verified": {"verification": result(True, 1.0, "1\n", STARTED)},
    "no_error": {"verification": result(False, 0.0, "wrong answer", STARTED)},
    "verifier_error": {"verification": result(False, 0.0, "", STARTED, "verifier raised AttributeError: 'str'")},
}
PAIRS = [("unpriced", "priced"), ("unverified", "verified"), ("no_error", "verifier_error")]


def write_run(path: Path, rows: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def run_file(folder: Path, name: str) -> Path:
    rows = [
        record({"prompt": f"{name} {i}"}, [Turn("done", "thought", finish_reason="stop")], **RUNS[name])
        for i in range(3)
    ]
    return write_run(folder / f"{name}.jsonl", rows)


def large_file(folder: Path) -> Path:
    """Over 10 MB of unpriced, unverified rows without a tool call (datasets types a file by its first
    10 MB), then one priced row whose verifier broke, with calls."""
    quiet = record({"prompt": "hi"}, [Turn("x" * 200_000, "thought", finish_reason="stop")], cost=None)
    late = record(
        {"prompt": "work"}, BUSY_TURNS, "length", cost=0.02, verification=RUNS["verifier_error"]["verification"]
    )
    path = write_run(folder / "large.jsonl", [quiet] * 60 + [late])
    assert path.stat().st_size > 11 << 20
    return path


def test_every_kind_of_run_has_one_arrow_schema_and_no_null():
    rows = {name: record({"prompt": name}, [], **kind) for name, kind in RUNS.items()}
    schemas = {name: arrow_schema(row) for name, row in rows.items()}
    assert len(set(schemas.values())) == 1, schemas
    assert all(untyped(row) == [] for row in rows.values())
    usage, verification = rows["unpriced"]["metadata"]["usage"], rows["unverified"]["metadata"]["verification"]
    assert (usage["cost"], usage["cost_known"]) == (0.0, False)  # a placeholder, flagged: never a made-up 0
    assert rows["priced"]["metadata"]["usage"] | {"cost_known": True} == rows["priced"]["metadata"]["usage"]
    assert verification == unverified() and verification["verified"] is False
    assert rows["no_error"]["metadata"]["verification"]["error"] == ""


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=["-".join(p) for p in PAIRS])
def test_two_runs_that_differ_load_together_in_both_orders(tmp_path, first, second):
    files = [run_file(tmp_path, first), run_file(tmp_path, second)]
    for order, cache in ((files, "forward"), (files[::-1], "backward")):
        loaded = load(order, tmp_path / cache)
        assert loaded.num_rows == 6
        assert loaded.features == load(files[:1], tmp_path / f"{cache}-alone").features


def test_a_file_over_10_mb_whose_first_rows_leave_fields_unset_loads_alone_and_with_every_run(tmp_path):
    large = large_file(tmp_path)
    loaded = load([large], tmp_path / "alone")
    assert loaded.num_rows == 61
    last = loaded[60]
    assert json.loads(last["conversations"][2]["tool_calls"])[0]["id"] == "c1"
    assert last["metadata"]["verification"]["error"] == "verifier raised AttributeError: 'str'"
    assert last["metadata"]["verification"]["verified"] is True and last["metadata"]["usage"]["cost_known"] is True
    assert loaded[0]["metadata"]["usage"]["cost_known"] is False
    files = [large, *(run_file(tmp_path, name) for name in RUNS)]
    for order, cache in ((files, "forward"), (files[::-1], "backward")):
        assert load(order, tmp_path / cache).num_rows == 61 + 3 * len(RUNS)


def test_a_merge_gives_records_of_an_older_version_this_versions_shape(tmp_path):
    """Batch lines written before no leaf was null (a resumed old run folder) come out typed like new ones."""
    old = [record({"prompt": f"old {i}"}, BUSY_TURNS, **RUNS[name]) for i, name in enumerate(RUNS)]
    for row in old:  # as the previous version wrote them
        metadata = row["metadata"]
        if not metadata["usage"].pop("cost_known"):
            metadata["usage"]["cost"] = None
        verification = metadata["verification"]
        if not verification.pop("verified"):
            metadata["verification"] = dict.fromkeys(verification)
            metadata["reward"] = None
        verification["error"] = verification["error"] or None
    folder = RunFolder(tmp_path)
    write_run(folder.batch_file(0), old)
    totals = merge(folder, True, TOOLS, print)
    assert totals.trajectories == len(RUNS) and not totals.cost_known and totals.verification["verified_samples"] == 3
    merged = [json.loads(line) for line in folder.trajectories.read_text().splitlines()]
    assert [untyped(row) for row in merged] == [[]] * len(RUNS)
    assert arrow_schema(*merged) == arrow_schema(BUSY)
    assert [row["metadata"]["usage"]["cost_known"] for row in merged] == [False, True, True, True, True, True]
    assert [row["metadata"]["verification"]["verified"] for row in merged] == [False] * 3 + [True] * 3


def test_outputs_of_runs_that_did_different_things_load_together_in_either_order(run_here, server, tmp_path):
    server.cost = None  # the server reports no cost: only the run given prices knows its cost
    runs = {
        "quiet": ([{"prompt": f"say hi {i} [mock turns=0]", "lang": "en"} for i in range(3)], []),
        "tools": (
            [
                {"prompt": "work [mock turns=2]", "id": 1, "answer": {"value": 3.5}},
                {"prompt": "broken [mock bad_json]", "id": 2, "answer": {"value": 1}},
                {"prompt": "cut [mock turns=5]", "tags": ["a", "b"]},
            ],
            ["--max_turns=3"],
        ),
        "silent": ([{"prompt": "no thoughts [mock reasoning=none]", "cwd": "sub"}], ["--require_reasoning=False"]),
        "streamed": ([{"prompt": "streamed [mock reasoning=think]"}], ["--stream"]),
        # Priced, verified, one verifier error (a timeout): the others are unpriced and unverified.
        "checked": (
            [{"prompt": "checked [mock turns=0]", "verify": "exit 0"}, {"prompt": "slow check", "verify": "sleep 5"}],
            ["--price_input=1", "--price_output=2", "--verify_timeout=0.5"],
        ),
    }
    files = []
    for name, (entries, extra) in runs.items():
        result = run_here(entries, "--environment=local", "--distribution=terminal_only", *extra, run_name=name)
        assert result.code == 0, result.stdout + result.stderr
        assert len(result.trajectories) == len(entries)
        files.append(result.run_dir / "trajectories.jsonl")
    # The runs did differ: one called no tool at all, another cut a session at --max_turns.
    assert all(json.loads(line)["api_calls"] == 1 for line in files[0].read_text().splitlines())
    assert any(json.loads(line)["partial"] for line in files[1].read_text().splitlines())
    checked = [json.loads(line)["metadata"] for line in files[4].read_text().splitlines()]
    assert all(m["usage"]["cost_known"] and m["verification"]["verified"] for m in checked)
    assert sorted(m["verification"]["error"] for m in checked) == ["", "verify command timed out after 0.5s"]
    assert not json.loads(files[0].read_text().splitlines()[0])["metadata"]["usage"]["cost_known"]
    for order, cache in ((files, "forward"), (files[::-1], "backward")):
        loaded = load(order, tmp_path / cache)
        assert loaded.num_rows == 10
    for line in (line for f in files for line in f.read_text().splitlines()):
        assert untyped(json.loads(line)) == [], line[:200]
