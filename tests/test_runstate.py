"""RunState in-process: what each worker event does to the checkpoint and errors.jsonl, and that
every event survives the trip between processes."""

from __future__ import annotations

import json
import pickle

import pytest

from trajforge.events import Claimed, LogLine, PromptDone, PromptError, PromptFailed, RunRefused
from trajforge.runfolder.folder import RunFolder, write_json_atomic
from trajforge.runfolder.state import RunState

ENTRIES = {i: {"prompt": f"p{i}"} for i in range(5)}


@pytest.fixture
def folder(tmp_path) -> RunFolder:
    (tmp_path / "run").mkdir()
    return RunFolder(tmp_path / "run")


def new_state(folder: RunFolder, done: list[int] = ()) -> RunState:
    return RunState(folder, "demo", "data/prompts.jsonl", ENTRIES, list(done))


def saved(state: RunState) -> dict:
    state.save()
    return json.loads(state.folder.checkpoint.read_text())


def test_done_counts_its_outcome_and_retries_per_batch(folder):
    state = new_state(folder, done=[4])
    state.record(PromptDone(0, 7, "completed", 2))
    state.record(PromptDone(1, 7, "no_reasoning", 0))
    state.record(PromptDone(2, 8, "max_turns", 1, line=b"{}\n"))
    checkpoint = saved(state)
    assert checkpoint["run_name"] == "demo" and checkpoint["dataset_file"] == "data/prompts.jsonl"
    assert checkpoint["completed_prompts"] == [0, 1, 2, 4] and checkpoint["failed_prompts"] == []
    assert checkpoint["batch_stats"] == {
        "7": {"completed": 1, "no_reasoning": 1, "retries": 2},
        "8": {"max_turns": 1, "retries": 1},
    }
    assert "last_updated" in checkpoint
    assert state.retries == 3 and state.stopped is None
    assert not folder.errors.exists()


def test_failed_writes_an_error_line_with_its_source(folder):
    state = new_state(folder)
    state.record(PromptFailed(3, 2, PromptError("api_http_500", "server error", 3)))
    (line,) = folder.error_lines()
    assert {k: line[k] for k in ("prompt_index", "batch_num", "error_type", "message", "attempts")} == {
        "prompt_index": 3,
        "batch_num": 2,
        "error_type": "api_http_500",
        "message": "server error",
        "attempts": 3,
    }
    assert line["source"] == {"prompt": "p3"} and "time" in line
    checkpoint = saved(state)
    assert checkpoint["failed_prompts"] == [3] and checkpoint["completed_prompts"] == []
    assert checkpoint["batch_stats"] == {"2": {"failed": 1, "retries": 2}}  # the failed call's retries
    assert state.stopped is None


def test_a_lost_worker_has_no_batch_and_no_batch_stats(folder):
    state = new_state(folder)
    state.record(PromptFailed(1, None, PromptError("worker_died", "worker process exited with -9", 1)))
    (line,) = folder.error_lines()
    assert (line["batch_num"], line["error_type"], line["source"]) == (None, "worker_died", {"prompt": "p1"})
    checkpoint = saved(state)
    assert checkpoint["failed_prompts"] == [1] and checkpoint["batch_stats"] == {}


def test_refused_stops_the_run_and_is_recorded_as_a_failure(folder):
    state = new_state(folder)
    state.record(RunRefused(0, 5, "HTTP 401: invalid key"))
    assert state.stopped == "HTTP 401: invalid key"
    (line,) = folder.error_lines()
    assert (line["error_type"], line["message"], line["attempts"]) == ("api_refused", "HTTP 401: invalid key", 1)
    assert line["source"] == {"prompt": "p0"}
    assert saved(state)["batch_stats"] == {"5": {"failed": 1, "retries": 0}}


def test_retries_carry_over_from_an_earlier_checkpoint(folder):
    write_json_atomic(folder.checkpoint, {"batch_stats": {"0": {"completed": 2, "retries": 4}}})
    state = new_state(folder, done=[0, 1])
    state.record(PromptDone(2, 1, "completed", 1))
    state.record(PromptFailed(3, 1, PromptError("api_timeout", "timed out", 2)))
    assert state.retries == 6
    assert saved(state)["batch_stats"] == {
        "0": {"completed": 2, "retries": 4},
        "1": {"completed": 1, "retries": 2, "failed": 1},
    }


def test_settle_replaces_what_events_said(folder):
    state = new_state(folder)
    state.record(PromptDone(0, 0, "completed", 0))
    state.record(PromptFailed(1, 0, PromptError("crash_ValueError", "boom", 1)))
    state.settle(done=[0, 1, 2], failed=[3])  # the batch files and errors.jsonl have the last word
    checkpoint = json.loads(folder.checkpoint.read_text())
    assert checkpoint["completed_prompts"] == [0, 1, 2] and checkpoint["failed_prompts"] == [3]
    assert not state.dirty


@pytest.mark.parametrize(
    "event",
    [
        Claimed((0, 1, 2), 4242),
        PromptDone(0, 1, "completed", 2),
        PromptDone(0, 1, "hallucinated_tool", 0, line=b'{"prompt_index": 0}\n'),
        PromptFailed(1, None, PromptError("worker_died", "no worker process left", 1)),
        RunRefused(2, 3, "HTTP 402: out of credit"),
        LogLine("[prompt 0] assistant: hello"),
    ],
    ids=lambda event: type(event).__name__,
)
def test_every_event_pickles(event):
    assert pickle.loads(pickle.dumps(event)) == event
