"""Spend control end to end, against the scripted server: costs that are never silently zero, a budget
the run does not cross (exit 3), nothing paid for twice after a budget stop or a kill -9, the
per-prompt limits, and the bad flags that stop a run before any request.

Runs go through batch_runner's entry point in this process (`run_here`) unless the process is the
point (kill -9)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from collections import Counter

import pytest
from conftest import source, wait_for
from test_resume import released

from trajforge.money.store import FILE_NAME

FLAGS = ["--distribution=terminal_only", "--environment=local", "--seed=7"]
CALLS_PER_PROMPT = 3  # the scripted model on terminal_only: terminal + write_file, read_file, the answer


def assert_no_step_answered_twice(server, entries: list[dict] | None = None) -> None:
    """The server answered no conversation step (a chat request body) twice; identical copies of an
    entry are samples of their own, whose first request is the same."""
    copies = Counter(entry["prompt"] for entry in entries or [])
    answered = Counter(
        (json.dumps(r["body"], sort_keys=True), r["prompt"]) for r in server.chat_requests() if r["status"] == 200
    )
    twice = {step for (step, prompt), count in answered.items() if count > max(copies[prompt], 1)}
    when = [
        (r["prompt"], round(r["at"], 3))
        for r in server.chat_requests()
        if json.dumps(r["body"], sort_keys=True) in twice
    ]
    assert not twice, f"answered more than once: {when} {[step[-600:] for step in twice]}"


def answered_calls(server) -> int:
    return sum(r["status"] == 200 for r in server.chat_requests())


def paid_calls(run_dir) -> int:
    with sqlite3.connect(run_dir / FILE_NAME) as db:
        return db.execute("SELECT paid_calls FROM totals").fetchone()[0]


def ledger(run_dir) -> list[float]:
    """The cost of every paid call, from the money database."""
    with sqlite3.connect(run_dir / FILE_NAME) as db:
        return [cost for (cost,) in db.execute("SELECT cost FROM paid")]


@pytest.mark.parametrize(
    ("cost", "budget"),
    [(0.01, 0.1), ("tokens", 0.0006)],  # the same every call; growing with the conversation (about $0.00005 to 0.0001)
)
def test_a_budget_stops_the_run_with_exit_3_and_resume_pays_for_nothing_twice(run_here, server, cost, budget):
    server.cost = cost
    entries = [{"prompt": f"budgeted task {i}"} for i in range(6)]  # 18 calls
    flags = [*FLAGS, "--num_workers=2", "--concurrency=2"]
    first = run_here(entries, *flags, f"--max_cost={budget}")
    assert first.code == 3, first.stdout + first.stderr
    stats = first.statistics
    in_flight, paid = 2 * 2, ledger(first.run_dir)
    spent = stats["budget"]["spent"]
    assert len(paid) == len(server.chat_requests()) and spent == pytest.approx(sum(paid))  # unfinished prompts' too
    assert spent <= budget + in_flight * max(paid) + 1e-9  # the overshoot is bounded by the calls in flight
    print(
        f"\n{cost=}: spent ${spent:.6f} of ${budget}, overshoot ${spent - budget:+.6f}, largest call ${max(paid):.6f}"
    )
    assert stats["budget"] == {"max_cost": budget, "spent": spent, "stopped": True}
    assert stats["remaining"] > 0 and stats["failed"] == 0
    assert len(first.batch_lines) == stats["total_prompts"] - stats["remaining"]  # stopped prompts left no line
    # and are not failures: their lines in errors.jsonl say budget, a class that uses no try
    assert {(e["error_class"], e["attempts"]) for e in first.jsonl("errors.jsonl")} <= {("budget", 0)}
    assert "Budget reached" in first.stdout and f"of {stats['total_prompts']} dataset entries remain" in first.stdout
    assert "--resume --max_cost=" in first.stdout
    assert f"${spent:.4f} spent" in first.stderr  # the progress line (here a plain one: stdout is no terminal)
    assert_no_step_answered_twice(server)
    # What the stopped prompts had paid for (none, if the stop came between prompts) the resume takes from the cache.
    stopped_paid = len(paid) - len(first.batch_lines) * CALLS_PER_PROMPT

    again = run_here(entries, *flags, "--resume", "--max_cost=1")
    assert again.code == 0, again.stdout + again.stderr
    assert len(again.trajectories) == 6
    assert_no_step_answered_twice(server)  # the stopped prompts' paid calls came from the cache
    stats = again.statistics
    assert stats["cache"]["hits"] == stopped_paid and (stats["cache"]["saved_cost"] > 0) == (stopped_paid > 0)
    assert stats["cache"]["misses"] == len(server.chat_requests()) == 6 * CALLS_PER_PROMPT
    everything = sum(ledger(again.run_dir))
    assert stats["budget"] == {"max_cost": 1.0, "spent": pytest.approx(everything), "stopped": False}
    assert stats["usage"]["cost"] == pytest.approx(everything) and stats["cost_known"] is True


def test_kill_9_then_resume_pays_for_no_answered_call_twice(run, run_here, server):
    server.latency = 0.05
    entries = [{"prompt": f"killed task {i % 5}"} for i in range(8)]  # with identical copies
    proc = subprocess.Popen(
        run.command(entries, *FLAGS, "--num_workers=2", "--concurrency=2", batch_size=3),
        cwd=run.tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    run_dir = run.tmp_path / "out" / "run"
    wait_for(lambda: len(server.chat_requests()) >= 7, what="a few answered calls")
    server.hold()  # what is in flight now stays unanswered: every answered call is one the run received
    wait_for(lambda: paid_calls(run_dir) == answered_calls(server), what="the answers to be stored")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: released(run), what="the killed workers to be gone")
    server.release(answer=False)  # the killed run's requests die with it
    before = answered_calls(server)
    finished = sum(path.read_bytes().count(b"\n") for path in run_dir.glob("batch_*.jsonl"))

    result = run_here(entries, *FLAGS, "--num_workers=2", "--concurrency=2", "--resume", batch_size=3)
    assert result.code == 0, result.stdout + result.stderr
    assert Counter(source(r)["prompt"] for r in result.trajectories) == Counter(e["prompt"] for e in entries)
    # The workspace has the same path on the re-run (its first tool result prints `pwd`), so every
    # call answered before the kill was answered from the cache.
    assert_no_step_answered_twice(server, entries)
    assert answered_calls(server) == 8 * CALLS_PER_PROMPT
    # Every answered call of a prompt the kill cut short came from the cache.
    assert result.statistics["cache"]["hits"] == before - CALLS_PER_PROMPT * finished


def test_prices_make_the_cost_of_an_endpoint_that_reports_none(run_here, server):
    server.cost = None  # a vLLM or llama.cpp server
    result = run_here([{"prompt": "priced [mock cached=5]"}], *FLAGS, "--price_input=2", "--price_output=8")
    assert result.code == 0, result.stdout
    (record,) = result.trajectories
    usage = record["metadata"]["usage"]
    assert usage["cached_tokens"] == 5 * CALLS_PER_PROMPT  # without --price_cached_input: priced as input
    assert usage["cost"] == pytest.approx((usage["prompt_tokens"] * 2 + usage["completion_tokens"] * 8) / 1e6)
    assert result.statistics["cost_known"] is True
    assert result.statistics["budget"]["spent"] == pytest.approx(usage["cost"])


def test_cached_prompt_tokens_are_priced_as_cached(run_here, server):
    server.cost = None
    prices = ["--price_input=10", "--price_output=0", "--price_cached_input=1"]
    result = run_here([{"prompt": "mostly cached [mock cached=10]"}], *FLAGS, *prices)
    usage = result.trajectories[0]["metadata"]["usage"]
    cached = usage["cached_tokens"]
    assert cached == 10 * CALLS_PER_PROMPT
    assert usage["cost"] == pytest.approx(((usage["prompt_tokens"] - cached) * 10 + cached * 1) / 1e6)
    assert result.statistics["usage"]["cached_tokens"] == cached


def test_no_prices_and_no_reported_cost_is_unknown_never_zero(run_here, server):
    server.cost = None
    result = run_here([{"prompt": "free? [mock]"}, {"prompt": "or not"}], *FLAGS)
    assert result.code == 0, result.stdout
    # The record's placeholder 0.0 is flagged unknown; statistics.json's total is null.
    assert [(r["metadata"]["usage"]["cost"], r["metadata"]["usage"]["cost_known"]) for r in result.trajectories] == [
        (0.0, False),
        (0.0, False),
    ]
    stats = result.statistics
    assert stats["usage"]["cost"] is None and stats["cost_known"] is False and stats["budget"]["spent"] is None
    assert "cost unknown" in result.stdout and "--price_input" in result.stdout


def test_a_budget_with_no_way_to_know_the_cost_stops_at_the_first_reply(run_here, server):
    server.cost = None
    entries = [{"prompt": f"blind {i}"} for i in range(4)]
    result = run_here(entries, *FLAGS, "--num_workers=1", "--max_cost=1")
    assert result.code == 2, result.stdout + result.stderr
    assert len(server.chat_requests()) == 1  # one call finds out; nothing more runs blind
    assert "--price_input" in result.stdout and "--price_output" in result.stdout
    assert result.batch_lines == [] and result.statistics["failed"] == 0
    assert [(e["error_type"], e["error_class"]) for e in result.jsonl("errors.jsonl")] == [("cost_unknown", "budget")]
    # With prices the same folder goes on, the paid reply answered from the cache.
    again = run_here(entries, *FLAGS, "--resume", "--max_cost=1", "--price_input=1", "--price_output=1")
    assert again.code == 0 and again.statistics["cache"]["hits"] == 1
    assert_no_step_answered_twice(server)
    # The reply paid blind is priced now, in its record and in the ledger: every cost is known.
    assert again.statistics["cost_known"] and again.statistics["budget"]["spent"] == again.statistics["usage"]["cost"]
    assert all(r["metadata"]["usage"]["cost"] > 0 for r in again.trajectories)
    assert "cost unknown" not in again.stdout


def test_the_tools_model_calls_count_in_the_prompts_cost(run_here, server):
    server.cost = 0.01
    result = run_here([{"prompt": "draw and look"}], "--distribution=creative", "--environment=local", "--seed=1")
    assert result.code == 0, result.stdout
    (record,) = result.trajectories
    tool_calls = [r for r in server.requests if r["path"].endswith("/images/generations")]
    tool_calls += [r for r in server.chat_requests() if not r["body"].get("tools")]  # vision: offered no tools
    assert tool_calls, "the draw offered neither image_gen nor vision"
    assert record["metadata"]["usage"]["cost"] == pytest.approx(0.01 * (record["api_calls"] + len(tool_calls)))


@pytest.mark.parametrize(
    ("flag", "exit_reason", "calls"),
    [("--max_tokens_per_prompt=1", "token_limit", 1), ("--max_cost_per_prompt=0.015", "cost_limit", 2)],
)
def test_per_prompt_limits_end_a_session_partial(run_here, server, flag, exit_reason, calls):
    server.cost = 0.01
    result = run_here([{"prompt": "limited"}], *FLAGS, flag)
    assert result.code == 0, result.stdout
    (record,) = result.trajectories
    assert (record["metadata"]["exit_reason"], record["partial"], record["api_calls"]) == (exit_reason, True, calls)
    assert result.statistics["partial"] == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max_cost=-1"], "--max_cost must be more than 0"),
        (["--max_cost=lots"], "--max_cost must be an amount in USD"),
        (["--max_cost_per_prompt=0"], "--max_cost_per_prompt must be more than 0"),
        (["--price_input=1"], "--price_input and --price_output go together"),
        (["--price_cached_input=1"], "--price_input and --price_output go together"),
        (["--price_input=1", "--price_output=nan"], "--price_output must be a price"),
        (["--max_tokens_per_prompt=0"], "--max_tokens_per_prompt must be at least 1"),
        (["--max_requests_per_minute=0"], "--max_requests_per_minute must be more than 0"),
        (["--max_tokens_per_minute=inf"], "--max_tokens_per_minute must be a number"),
        (["--adaptive_concurrency=maybe"], "--adaptive_concurrency must be true or false"),
    ],
)
def test_bad_money_flags_stop_before_any_request(run_here, server, flags, message):
    result = run_here([{"prompt": "never sent"}], *FLAGS, *flags)
    assert result.code == 2 and message in result.stderr, result.stderr
    assert server.requests == []
