"""Outputs load together: any set of trajectories.jsonl files, from runs that did anything, loads in one
`datasets.load_dataset("json", data_files=[...])`, in any order, also a file over 10 MB whose first rows
have no tool call.

`datasets` types each column by the first file (and the first 10 MB chunk of a file) and casts the rest
to it; a value empty or null in one run and typed in another fails the cast one way round. So the checks
are generic: whatever keys a record gains later must keep every row's types the same."""

from __future__ import annotations

import io
import json
from pathlib import Path

import orjson
import pytest

from trajectory import ToolCall, Turn, build_record

pa_json = pytest.importorskip("pyarrow.json")
TOOLS = ["read_file", "terminal", "write_file"]
SCHEMA = {"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}


def record(entry: dict, turns: list[Turn], exit_reason: str = "completed") -> dict:
    """A record as the worker writes it (orjson, one line), read back."""
    built = build_record(
        prompt_index=3,
        entry=entry,
        turns=turns,
        tool_schemas=[SCHEMA],
        toolsets=["terminal"],
        tool_names=TOOLS,
        api_calls=len(turns),
        exit_reason=exit_reason,
        usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "reasoning_tokens": 0, "cost": 0.0},
        metadata={"batch_num": 0, "model": "m", "run_name": "r", "duration_seconds": 1.5},
    )
    return orjson.loads(orjson.dumps(built))


QUIET = record({"prompt": "hi"}, [Turn("hello", "", finish_reason="stop")])
BUSY = record(
    {"prompt": "work", "id": 7, "answer": {"value": [1, 2]}, "image": "python:3.12"},
    [
        Turn("", "plan", [ToolCall("c1", "terminal", '{"command": "ls"}', {"output": "x"})], "tool_calls"),
        Turn("", "", [ToolCall("c2", "nope", "{broken", {"error": "unknown tool"})], "tool_calls"),
        Turn("cut off mid-wo", "more", finish_reason="length"),
    ],
    exit_reason="length",
)


# Null by contract where a value is unknown (DESIGN.md): a sample nothing verified, a cost nobody priced.
NULLABLE = {f".metadata.verification.{key}" for key in ("passed", "reward", "output", "duration_seconds", "error")}
NULLABLE |= {".metadata.reward", ".metadata.usage.cost"}


def untyped(value, path: str = "") -> list[str]:
    """Paths of values whose Arrow type depends on other rows: null (outside the contract's few unknowns),
    an empty list or object."""
    if (value is None and path not in NULLABLE) or value == [] or value == {}:
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


def test_a_file_over_10_mb_whose_first_rows_have_no_tool_call_loads(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    filler = "x" * 200_000
    quiet = record({"prompt": "hi"}, [Turn(filler, "thought", finish_reason="stop")])
    with open(path, "wb") as handle:
        for _ in range(60):  # 12 MB without a single call: datasets reads 10 MB, types, then casts the rest
            handle.write(orjson.dumps(quiet) + b"\n")
        handle.write(orjson.dumps(BUSY) + b"\n")
    assert path.stat().st_size > 11 << 20
    loaded = load([path], tmp_path / "cache")
    assert loaded.num_rows == 61
    assert json.loads(loaded[60]["conversations"][2]["tool_calls"])[0]["id"] == "c1"


def test_outputs_of_runs_that_did_different_things_load_together_in_either_order(run_here, tmp_path):
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
    for order, cache in ((files, "forward"), (files[::-1], "backward")):
        loaded = load(order, tmp_path / cache)
        assert loaded.num_rows == 8
    for line in (line for f in files for line in f.read_text().splitlines()):
        assert untyped(json.loads(line)) == [], line[:200]
