"""Checkpoint, resume and fault tolerance: a crash, a rate limit or a bad reply never loses finished
work or pays for it twice.

Runs go through batch_runner's entry point in this process (`run_here`) unless the process is the
point: kill -9, Ctrl-C, a second run while the first still holds the folder, the exit of a stopped run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import API_KEY, released, settled, source, wait_for

TOOLS = ["--distribution=terminal_only", "--max_retries=2"]


def sources(result) -> Counter:
    return Counter(source(r)["prompt"] for r in result.trajectories)


def asked(server) -> Counter:
    """How many chat requests each prompt caused."""
    return Counter(r["prompt"] for r in server.chat_requests())


def test_rate_limit_with_retry_after_completes_in_the_same_run(run_here, server):
    entries = [{"prompt": "busy [mock fail=429 times=2 retry_after=0.3]"}, {"prompt": "calm"}]
    result = run_here(entries, *TOOLS, "--verbose")
    assert result.code == 0, result.stderr
    assert len(result.trajectories) == 2
    busy = [r for r in server.chat_requests() if "busy" in r["prompt"]]
    assert [r["status"] for r in busy[:3]] == [429, 429, 200]
    assert busy[0]["body"] == busy[1]["body"] == busy[2]["body"]  # the same request, sent again
    assert result.statistics["retries"] == 2
    # Both waits are the server's Retry-After (0.3 s), not the client's own random backoff.
    waits = re.findall(r"\[prompt 0\] retry (\d)/2 in ([\d.]+)s", result.stderr)
    assert waits == [("1", "0.3"), ("2", "0.3")], result.stderr


def test_server_errors_fail_the_prompt_and_resume_retries_only_it(run_here, server):
    entries = [{"prompt": "ok one"}, {"prompt": "flaky [mock fail=500 times=3]"}, {"prompt": "ok two"}]
    first = run_here(entries, *TOOLS)
    assert first.code == 1
    assert "1 prompt(s) failed" in first.stdout and "--resume" in first.stdout
    assert sorted(sources(first)) == ["ok one", "ok two"]
    (error,) = first.jsonl("errors.jsonl")
    assert (error["prompt_index"], error["error_type"], error["attempts"]) == (1, "api_http_500", 3)
    assert first.statistics["failed"] == 1 and first.statistics["errors"] == {"api_http_500": 1}
    assert first.statistics["remaining"] == 1 and first.statistics["retries"] == 2
    assert first.checkpoint["failed_prompts"] == [1]
    before = asked(server)

    second = run_here(entries, *TOOLS, "--resume")
    assert second.code == 0, second.stdout
    new = asked(server) - before
    assert set(new) == {"flaky [mock fail=500 times=3]"}  # finished prompts were never sent again
    assert sources(second) == Counter(e["prompt"] for e in entries)
    assert second.statistics["failed"] == 0 and second.statistics["trajectories"] == 3
    assert second.statistics["remaining"] == 0
    assert second.statistics["retries"] == 2  # the whole folder's: the first run's failed attempts
    assert sorted(second.checkpoint["completed_prompts"]) == [0, 1, 2]


@pytest.mark.parametrize("stream", [False, True])
def test_a_200_reply_without_an_answer_is_retried_not_saved(run_here, stream):
    entries = [{"prompt": f"upstream hiccup [mock {fault} times=1]"} for fault in ("upstream_error", "empty")]
    result = run_here(entries, *TOOLS, f"--stream={stream}")
    assert result.code == 0, result.stdout
    assert len(result.trajectories) == 2
    for record in result.trajectories:
        assert record["completed"] and record["conversations"][-1]["value"].count("Here is my answer") == 1
    assert result.statistics["retries"] == 2  # one per prompt


def test_flagged_and_bad_requests_fail_alone_and_at_once(run_here, server):
    flagged, bad = {"prompt": "flagged [mock fail=403 flagged]"}, {"prompt": "bad request [mock fail=400]"}
    # One worker, one slot: a 403 taken for a refused key would stop the run before the fine prompts.
    result = run_here([flagged, bad, {"prompt": "fine"}, {"prompt": "also fine"}], *TOOLS, "--num_workers=1")
    assert result.code == 4  # both failed for good (class endpoint): nothing is left that --resume would send
    assert "refused" not in result.stdout and len(result.trajectories) == 2
    errors = {e["error_type"]: e for e in result.jsonl("errors.jsonl")}
    assert set(errors) == {"api_http_403", "api_http_400"}
    assert errors["api_http_403"]["source"] == flagged
    assert errors["api_http_400"]["attempts"] == 1 and asked(server)[bad["prompt"]] == 1  # not retried


def test_refused_key_stops_the_whole_run(run, server):
    # A subprocess: a backlog of batches left in a pipe would hang the exit of the process.
    server.api_key = "the-right-key"
    entries = [{"prompt": f"p{i}"} for i in range(3000)]  # a backlog of batches must not hang the exit
    result = run(entries, *TOOLS, "--num_workers=2", timeout=60)
    assert result.code == 1
    assert "the API key was refused" in result.stdout
    assert len(server.requests) <= 4  # one per worker slot, then the run stopped
    assert result.jsonl("errors.jsonl")[0]["error_type"] == "api_refused"


def test_request_timeout_fails_and_is_retried_later(run_here, server):
    result = run_here([{"prompt": "slow [mock latency=3]"}], *TOOLS, "--request_timeout=0.5", "--max_retries=0")
    assert result.code == 1
    (error,) = result.jsonl("errors.jsonl")
    assert error["error_type"] == "api_timeout" and error["attempts"] == 1


def test_a_finished_run_is_rebuilt_on_resume_without_calling_the_model(run_here, server):
    entries = [{"prompt": "kept"}, {"prompt": "silent [mock reasoning=none]"}]
    first = run_here(entries, *TOOLS)
    assert first.code == 0 and len(first.trajectories) == 1
    calls = len(server.requests)
    again = run_here(entries, *TOOLS)  # the same run name without --resume
    assert again.code == 2 and "pass --resume" in again.stderr
    # What a kill in the middle of the merge leaves: a half-written temporary file, no final files.
    (first.run_dir / ".trajectories.jsonl.abc123").write_text('{"prompt_index": 0, "conv')
    (first.run_dir / "trajectories.jsonl").unlink()
    (first.run_dir / "statistics.json").unlink()
    rebuilt = run_here(entries, *TOOLS, "--resume")
    assert rebuilt.code == 0 and sources(rebuilt) == Counter({"kept": 1})
    assert rebuilt.statistics["trajectories"] == 1 and "0 to run" in rebuilt.stdout
    assert not list(first.run_dir.glob(".trajectories.jsonl.*"))
    remerged = run_here(entries, *TOOLS, "--resume", "--require_reasoning=False")
    assert remerged.code == 0 and len(remerged.trajectories) == 2
    assert remerged.statistics["discarded_no_reasoning"] == 0
    assert len(server.requests) == calls


def test_duplicates_reordered_and_extended_datasets(run_here, server):
    # Matching itself: tests/test_match.py; here, the plan it makes and the batch files it leads to.
    entries = [{"prompt": "twice"}, {"prompt": "twice"}, {"prompt": "other"}, {"prompt": "img", "image": "a:1"}]
    first = run_here(entries[:3], *TOOLS, "--max_samples=2")
    assert first.code == 0 and sources(first) == Counter({"twice": 2})
    shuffled = [entries[2], entries[0], {"prompt": "new"}, entries[1], {"prompt": "twice"}]
    before = asked(server)
    second = run_here(shuffled, *TOOLS, "--resume")
    assert second.code == 0, second.stdout
    assert "2 prompts already done, 3 to run" in second.stdout
    assert sources(second) == Counter({"twice": 3, "other": 1, "new": 1})
    assert set(asked(server) - before) == {"twice", "other", "new"}
    # A removed prompt's trajectory stays; a prompt that differs only by its image is another task.
    third = run_here([{"prompt": "new"}, {"prompt": "other", "image": "x:1"}], *TOOLS, "--resume")
    assert third.code == 0 and sources(third)["other"] == 2 and sources(third)["twice"] == 3
    batch_numbers = sorted(r["metadata"]["batch_num"] for r in third.trajectories)
    assert batch_numbers[-1] >= 3  # resumed runs start new batch files after the highest one


def test_torn_last_line_is_ignored_and_rerun(run_here, server):
    entries = [{"prompt": f"p{i}"} for i in range(3)]
    first = run_here(entries, *TOOLS, "--num_workers=1", batch_size=3)
    assert first.code == 0
    batch = first.run_dir / "batch_0.jsonl"
    lines = batch.read_bytes().splitlines(keepends=True)
    torn = source(json.loads(lines[-1]))["prompt"]
    batch.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    second = run_here(entries, *TOOLS, "--resume")
    assert second.code == 0, second.stderr
    assert "batch_0.jsonl line 3 is incomplete" in second.stderr
    assert sources(second) == Counter(e["prompt"] for e in entries)
    # Three calls the first time; after the tear the prompt runs again, answered from the response cache.
    assert asked(server)[torn] == 3 and second.statistics["cache"]["hits"] == 3


def _start(run, entries, *flags):
    return subprocess.Popen(
        run.command(entries, *flags, batch_size=3),
        cwd=run.tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def paste(result_stdout: str, cwd: Path) -> subprocess.CompletedProcess:
    """The command the run printed last, pasted into a shell, with the key in the environment as the
    line's note says (it never carries the key itself)."""
    lines = result_stdout.strip().splitlines()
    command = next(line for line in reversed(lines) if "--resume" in line and not line.startswith("("))
    assert "<" not in command and ">" not in command and API_KEY not in command, command
    assert any("pass --api_key again or set OPENROUTER_API_KEY" in line for line in lines)
    env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")} | {"OPENAI_API_KEY": API_KEY}
    return subprocess.run(["sh", "-c", command], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def _lines(run) -> int:
    folder = run.tmp_path / "out" / "run"
    return sum(p.read_bytes().count(b"\n") for p in folder.glob("batch_*.jsonl")) if folder.exists() else 0


@pytest.mark.parametrize("kill_after_lines", [0, 4, 11])
def test_sigkill_at_any_moment_then_resume_is_exact(run, run_here, server, kill_after_lines):
    server.latency = 0.05
    entries = [{"prompt": f"task {i % 10}"} for i in range(12)]  # with duplicates
    proc = _start(run, entries, *TOOLS, "--num_workers=2", "--concurrency=2")
    wait_for(lambda: _lines(run) >= kill_after_lines and server.requests, what=f"{kill_after_lines} lines")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: released(run), what="the killed workers to be gone")
    wait_for(lambda: settled(server), what="the requests in flight at the kill")
    finished = _lines(run)
    asked_before = asked(server)
    result = run_here(entries, *TOOLS, "--resume", batch_size=3)
    assert result.code == 0, result.stdout + result.stderr
    assert sources(result) == Counter(e["prompt"] for e in entries)
    assert len(result.trajectories) == 12 and result.statistics["trajectories"] == 12
    # Work that was on disk was not paid for twice: only unfinished prompts were asked again.
    assert sum((asked(server) - asked_before).values()) <= 3 * (12 - finished)


def test_a_second_run_on_a_busy_folder_refuses(run, run_here, server):
    server.latency = 0.3  # one prompt after another, three calls each: the first run goes on for about 2.5 s
    entries = [{"prompt": f"slow {i}"} for i in range(3)]
    proc = _start(run, entries, *TOOLS, "--num_workers=1")
    wait_for(lambda: server.requests, what="the first run's first request")
    second = run_here(entries, *TOOLS, "--resume")
    assert second.code == 2 and "in use by another run" in second.stderr
    proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_ctrl_c_saves_and_says_how_to_resume(run, run_here, server):
    server.latency = 0.3
    entries = [{"prompt": f"slow {i}"} for i in range(20)]
    proc = _start(run, entries, *TOOLS, "--num_workers=2")
    wait_for(lambda: _lines(run) >= 2, what="two finished prompts")
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + stderr
    assert "rerun with --resume" in stdout
    folder = run.tmp_path / "out" / "run"
    checkpoint = json.loads((folder / "checkpoint.json").read_text())
    stats = json.loads((folder / "statistics.json").read_text())
    assert len(checkpoint["completed_prompts"]) == stats["trajectories"] >= 2
    assert not (folder / "errors.jsonl").exists()  # abandoned prompts are not failures
    server.latency = 0
    pasted = paste(stdout, run.tmp_path)  # the command it printed, pasted into a shell, goes on
    assert pasted.returncode == 0, pasted.stdout + pasted.stderr
    result = run_here(entries, *TOOLS, "--resume", batch_size=3)
    assert result.code == 0 and sources(result) == Counter(e["prompt"] for e in entries)
