"""No reply a hostile or broken server sends can crash or hang a prompt (issue 13, item 2).

The scripted model's hostile directives (trajforge/mock/model.py) send malformed tool calls, thousands
of calls, replies that never end, trickle or are too large; the agent loop runs in-process with a real
client, server and local environment. One subprocess run shows the whole program saving, failing and
resuming such prompts."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time

import httpx
import orjson
import pytest
from agent_run import OFFERED, agent
from conftest import sample_of, source

import batch_runner
from trajectory import ToolCall, Turn, discard_reason, split_reasoning, tool_stats
from trajforge.agent.calls import read_tool_calls
from trajforge.agent.loop import AgentResult
from trajforge.cli.config import build_config
from trajforge.errors import UsageError
from trajforge.model.outcomes import ModelCallFailed
from trajforge.model.reply_size import TooLarge, capper
from trajforge.model.retry import BadReply
from trajforge.model.stream import assemble
from trajforge.model.usage import add_usage, empty_usage

NAMES = sorted(OFFERED)
HUNG = 60.0  # seconds: far beyond every limit these tests set, so a run that reaches it did hang


def record(result: AgentResult, prompt: str) -> dict:
    """The trajectory record of `result`, as the worker writes it (orjson, one line)."""
    built = sample_of(
        entry={"prompt": prompt},
        turns=result.turns,
        tool_schemas=[t.schema for t in OFFERED.values()],
        toolsets=["terminal", "file"],
        tool_names=NAMES,
        api_calls=result.api_calls,
        exit_reason=result.exit_reason,
        usage=result.usage,
    )
    assert orjson.loads(built.journal())["version"] == 2  # its batch line is written whatever the reply held
    return orjson.loads(built.trajectory_line())


def sent_back(server) -> list[dict]:
    """The assistant message and the tool messages of the first turn, as the second request sent them."""
    messages = server.chat_requests()[1]["body"]["messages"]
    return [m for m in messages if m["role"] in ("assistant", "tool")]


def assert_each_call_answered_once(server) -> None:
    assistant, *answers = sent_back(server)
    ids = [call["id"] for call in assistant["tool_calls"]]
    assert len(set(ids)) == len(ids) and all(isinstance(i, str) and i for i in ids)
    assert [answer["tool_call_id"] for answer in answers] == ids


# -- malformed tool calls: answered as tool errors, the trajectory saved ---------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_name_that_is_a_list_is_answered_as_an_error(server, stream):
    result = agent(server, "list name [mock name_list]", stream=stream)
    first, second = result.turns[0].calls
    assert not first.ok and isinstance(first.name, str)
    if not stream:  # a stream's name comes in string pieces: a list there is not kept, so the name is empty
        assert first.name == '["terminal"]'
        assert first.result["error"] == "the name of a tool call must be a string, got a list"
    assert second.name == "write_file" and second.ok  # the rest of the reply still ran
    assert result.exit_reason == "completed"
    assert_each_call_answered_once(server)
    saved = record(result, "list name")
    assert saved["completed"] and saved["tool_stats"]["write_file"] == {"count": 1, "success": 1, "failure": 0}
    assert discard_reason(result.turns, set(OFFERED)) == "hallucinated_tool"  # not a tool it was offered


def test_tool_calls_sent_as_a_string_are_answered_as_one_error(server):
    result = agent(server, "string calls [mock calls_string]")
    (call,) = result.turns[0].calls
    assert call.id == "call_1_0" and json.loads(json.loads(call.name))[0]["function"]["name"] == "terminal"
    assert call.result == {"error": "tool_calls must be a list of calls, got a string"}
    assert result.exit_reason == "completed"
    assert_each_call_answered_once(server)
    assert record(result, "string calls")["completed"]
    assert discard_reason(result.turns, set(OFFERED)) == "hallucinated_tool"


def test_arguments_that_are_a_number_are_answered_as_an_error_and_count_as_a_failure(server):
    result = agent(server, "number args [mock args_number]")
    terminal = result.turns[0].calls[0]
    assert (terminal.name, terminal.arguments) == ("terminal", "42")
    assert terminal.result == {"error": "the arguments of a tool call must be a JSON object, got a number"}
    assert result.exit_reason == "completed"
    stats = record(result, "number args")["tool_stats"]["terminal"]
    assert stats["failure"] == 1 and stats["count"] == stats["success"] + 1
    assert discard_reason(result.turns, set(OFFERED)) is None


@pytest.mark.parametrize("directive", ["no_ids", "dup_ids"])
@pytest.mark.parametrize("stream", [False, True])
def test_missing_or_repeated_ids_get_fresh_ones_and_each_result_answers_one_call(server, directive, stream):
    result = agent(server, f"ids [mock {directive}]", stream=stream)
    ids = [call.id for call in result.turns[0].calls]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert all(call.ok for turn in result.turns for call in turn.calls)
    assert result.exit_reason == "completed"
    assert_each_call_answered_once(server)


def test_at_most_max_tool_calls_of_a_reply_run_the_rest_fail_without_running(server):
    started = time.monotonic()
    result = agent(server, "flood [mock calls=3000]", max_tool_calls=4)
    first = result.turns[0].calls
    assert len(first) == 3000 and len({c.id for c in first}) == 3000
    assert [c.result["output"] for c in first[:4]] == [f"step {i}\n" for i in range(1, 5)]
    assert all(c.result["error"].startswith("not run: this reply has 3000 tool calls and at most 4") for c in first[4:])
    stats = record(result, "flood")["tool_stats"]["terminal"]
    assert stats["count"] >= 3000 and stats["failure"] == 2996
    assert result.exit_reason == "completed"
    assert_each_call_answered_once(server)
    assert time.monotonic() - started < HUNG


def test_read_tool_calls_makes_every_shape_a_call_with_a_string_name_and_an_id_of_its_own():
    message = {
        "tool_calls": [
            "terminal",
            {"id": "call_1_2", "function": "terminal"},
            {"id": "call_1_2", "function": {"name": {"n": 1}, "arguments": [1]}},
            {"id": 7, "function": {"name": "read_file", "arguments": {"path": "a"}}},
            {"function": {"name": "terminal"}},
        ]
    }
    read = read_tool_calls(message, 1, limit=4)
    calls = [call for call, _ in read]
    assert [c.id for c in calls] == ["call_1_0", "call_1_2", "call_1_2_1", "call_1_3", "call_1_4"]
    assert [c.name for c in calls] == ['"terminal"', '"terminal"', '{"n": 1}', "read_file", "terminal"]
    assert [c.arguments for c in calls] == ["{}", "{}", "[1]", '{"path": "a"}', "{}"]
    problems = [problem for _, problem in read]
    assert problems[0] == "a tool call must be an object with a function {name, arguments}, got a string"
    assert problems[1].endswith("got a function that is a string")
    assert problems[2] == (
        "the name of a tool call must be a string, got an object; "
        "the arguments of a tool call must be a JSON object, got a list"
    )
    assert problems[3] is None and problems[4].startswith("not run: this reply has 5 tool calls and at most 4")
    assert read_tool_calls({"tool_calls": None}, 1, 4) == read_tool_calls({}, 1, 4) == []


def test_tool_stats_count_a_call_of_an_offered_name_only():
    calls = [ToolCall("a", '["terminal"]', "", {"error": "x"}), ToolCall("b", "terminal", "42", {"error": "y"})]
    stats, errors = tool_stats([Turn("", "thinking", calls)], NAMES)
    assert stats["terminal"] == {"count": 1, "success": 0, "failure": 1} and errors["terminal"] == 1


# -- what else a reply may carry: read, never a crash --------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        {"content": 42, "reasoning_details": 7},
        {"content": [{"text": 5}, {"text": "ok"}], "reasoning_details": [{"text": ["x"]}], "reasoning": {"a": 1}},
        {"content": None, "reasoning_details": "text"},
    ],
)
def test_split_reasoning_takes_any_message(message):
    reasoning, content = split_reasoning(message)
    assert isinstance(reasoning, str) and isinstance(content, str)


def test_add_usage_counts_what_is_not_a_plausible_number_as_nothing_and_such_a_cost_as_unknown():
    total = empty_usage()
    add_usage(total, {"prompt_tokens": 3, "completion_tokens_details": ["x"], "cost": 0.5})
    assert total["cost"] == 0.5
    add_usage(total, {"prompt_tokens": "12", "completion_tokens": 10**30, "total_tokens": float("inf"), "cost": []})
    add_usage(total, {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 9}, "cost": 0.5})
    # The total counts 3 + 1 prompt tokens (at most all of them cached); a cost that is no amount makes it unknown.
    assert total == {
        "prompt_tokens": 4,
        "completion_tokens": 0,
        "total_tokens": 4,
        "reasoning_tokens": 0,
        "cached_tokens": 1,
        "cost": None,
        "judge_tokens": 0,  # no judge call among them
        "judge_cost": 0.0,
    }


def test_assemble_takes_pieces_whose_index_is_not_a_number():
    delta = {"tool_calls": [{"index": [1], "id": "a", "function": {"name": "terminal", "arguments": "{}"}}]}
    delta["reasoning_details"] = [{"index": "x", "text": "t"}, {"index": 0, "text": "u"}]
    message = assemble([{"choices": [{"delta": delta}]}])["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "terminal"
    assert message["reasoning_details"] == [{"index": 0, "text": "tu"}]  # no index: the next free one


# -- --prompt_timeout: a whole session, model calls and tools --------------------------------------------------


def test_a_session_past_its_time_limit_ends_partial_with_the_turns_so_far(server):
    started = time.monotonic()
    result = agent(server, "slow tool [mock sleep=60 turns=1]", timeout=1.5)
    assert time.monotonic() - started < HUNG
    assert (result.exit_reason, result.api_calls) == ("timeout", 1)
    sleeping, write = result.turns[0].calls
    assert (
        sleeping.result
        == write.result
        == {"error": "not run or not finished: the prompt reached its time limit (--prompt_timeout)"}
    )
    saved = record(result, "slow tool")
    assert (saved["completed"], saved["partial"], saved["metadata"]["exit_reason"]) == (False, True, "timeout")
    assert saved["tool_stats"]["terminal"]["failure"] == 1


def test_the_time_limit_also_ends_a_model_call_that_never_answers(server):
    """With no turn to save, the prompt fails (and --resume runs it again) instead of saving nothing."""
    started = time.monotonic()
    with pytest.raises(ModelCallFailed) as failed:
        agent(server, "never [mock endless]", timeout=1, request_timeout=HUNG)
    assert time.monotonic() - started < HUNG
    assert (failed.value.kind, str(failed.value)) == ("timeout", "no model reply within --prompt_timeout (1s)")


# -- --request_timeout: the whole request, a stream included ---------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("directive", ["trickle=0.2", "endless"])
def test_a_reply_that_stalls_or_trickles_fails_its_attempt_which_is_retried(server, directive, stream):
    started = time.monotonic()
    result = agent(server, f"slow reply [mock {directive} times=1 turns=0]", stream=stream, request_timeout=1)
    assert time.monotonic() - started < HUNG
    assert (result.exit_reason, result.api_calls, result.retries) == ("completed", 1, 1)
    assert result.turns[0].content.startswith("Here is my answer")


def test_a_reply_that_keeps_trickling_fails_the_prompt_as_a_timeout(server):
    log: list[str] = []
    with pytest.raises(ModelCallFailed) as failed:
        agent(server, "slow reply [mock trickle=0.2]", request_timeout=1, max_retries=1, log=log)
    assert (failed.value.kind, failed.value.attempts) == ("timeout", 2)
    assert str(failed.value) == "no whole reply within 1s (--request_timeout)"
    assert any("no whole reply within 1s" in line for line in log)


# -- a reply over 20 MB ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_over_20_mb_is_a_bad_reply_retried_and_never_kept(server, stream):
    result = agent(server, "big [mock huge_mb=25 times=1 turns=0]", stream=stream)
    assert (result.exit_reason, result.retries) == ("completed", 1)
    assert len(result.turns[0].content) < 1000


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_always_over_20_mb_fails_the_prompt_as_a_bad_reply(server, stream):
    with pytest.raises(ModelCallFailed) as failed:
        agent(server, "big [mock huge_mb=25]", stream=stream, max_retries=1)
    assert (failed.value.kind, failed.value.attempts) == ("bad_reply", 2)
    assert "larger than 20 MB" in str(failed.value)


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_compressed_twice_is_a_bad_reply_never_decoded(server, stream):
    """2 KB sent as `Content-Encoding: gzip, gzip` that decode to 512 MB: refused by its header, retried."""
    result = agent(server, "bomb [mock gzip_bomb times=1 turns=0]", stream=stream)
    assert (result.exit_reason, result.retries) == ("completed", 1)
    with pytest.raises(ModelCallFailed) as failed:
        agent(server, "bomb [mock gzip_bomb]", stream=stream, max_retries=1)
    assert (failed.value.kind, failed.value.attempts) == ("bad_reply", 2)
    assert "reply compressed with 'gzip, gzip' although the request asked for none" in str(failed.value)


async def _read_capped(headers: dict, pieces: list[bytes], limit: int) -> bytes:
    async def body():
        for piece in pieces:
            yield piece

    response = httpx.Response(200, headers=headers, content=body())
    await capper(limit)(response)
    return await response.aread()


def test_the_size_limit_counts_the_bytes_of_a_body_of_unknown_length_as_they_come():
    assert asyncio.run(_read_capped({}, [b"x" * 10] * 3, limit=30)) == b"x" * 30
    with pytest.raises(TooLarge, match="reply larger than"):
        asyncio.run(_read_capped({}, [b"x" * 10] * 4, limit=30))


@pytest.mark.parametrize(
    ("headers", "message"),
    [({"Content-Length": "31"}, "reply larger than"), ({"Content-Encoding": "gzip"}, "compressed with 'gzip'")],
)
def test_the_size_limit_refuses_at_once_a_body_announced_too_large_or_compressed(headers, message):
    with pytest.raises(BadReply, match=message):
        asyncio.run(_read_capped(headers, [], limit=30))


# -- the flags -------------------------------------------------------------------------------------------------


def _flags(**given) -> dict:
    defaults = {name: p.default for name, p in inspect.signature(batch_runner.main).parameters.items()}
    return defaults | {"dataset_file": "d.jsonl", "batch_size": 1, "run_name": "r", "api_key": "k"} | given


def test_the_limits_default_to_32_calls_and_an_hour():
    config = build_config(_flags())
    assert (config.max_tool_calls_per_turn, config.prompt_timeout) == (32, 3600.0)
    config = build_config(_flags(max_tool_calls_per_turn="5", prompt_timeout="2.5"))
    assert (config.max_tool_calls_per_turn, config.prompt_timeout) == (5, 2.5)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("max_tool_calls_per_turn", 0, "--max_tool_calls_per_turn must be at least 1, got 0"),
        ("max_tool_calls_per_turn", "many", "--max_tool_calls_per_turn must be a whole number"),
        ("prompt_timeout", 0, "--prompt_timeout must be more than 0 and at most 10000000 seconds"),
        ("setup_timeout", 1e11, "--setup_timeout must be more than 0 and at most 10000000 seconds, got 100000000000.0"),
        ("prompt_timeout", "nan", "--prompt_timeout must be a number of seconds"),
        ("prompt_timeout", True, "--prompt_timeout must be a number of seconds"),
        ("request_timeout", -1, "--request_timeout must be more than 0 and at most"),
    ],
)
def test_bad_limits_are_refused_naming_the_flag(flag, value, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        build_config(_flags(**{flag: value}))


# -- the whole program ------------------------------------------------------------------------------------------

SAVED = {
    "list name [mock name_list]": ("completed", "hallucinated_tool"),
    "string calls [mock calls_string]": ("completed", "hallucinated_tool"),
    "number args [mock args_number]": ("completed", None),
    "no ids [mock no_ids]": ("completed", None),
    "flood [mock calls=3000]": ("completed", None),
    "slow tool [mock sleep=120 turns=1]": ("timeout", None),
}
FAILED = {"trickle [mock trickle=0.3]": "api_timeout", "endless [mock endless]": "api_timeout"}
FAILED["huge [mock huge_mb=25]"] = "api_bad_reply"


def test_a_run_over_hostile_replies_saves_or_fails_each_prompt_and_resumes(run):
    entries = [{"prompt": prompt} for prompt in [*SAVED, *FAILED]]
    flags = ["--distribution=terminal_only", "--environment=local", "--num_workers=2", "--concurrency=4"]
    # 4 s for a whole reply: reading 20 MB of the huge one has taken over 2 s on a busy machine. The
    # trickling and endless ones then fail after two tries (under 10 s), within the prompt's 15 s.
    flags += ["--max_tool_calls_per_turn=4", "--prompt_timeout=15", "--request_timeout=4", "--max_retries=1"]
    first = run(entries, *flags, batch_size=3, timeout=HUNG * 2)
    assert first.code == 1, first.stderr  # some prompts failed: --resume retries them
    lines = {source(line)["prompt"]: line for line in first.batch_lines}
    assert set(lines) == set(SAVED)
    for prompt, (exit_reason, discarded) in SAVED.items():
        assert (lines[prompt]["metadata"]["exit_reason"], lines[prompt].get("discarded")) == (exit_reason, discarded)
    assert lines["slow tool [mock sleep=120 turns=1]"]["partial"] is True
    flood = lines["flood [mock calls=3000]"]["tool_stats"]["terminal"]
    assert flood["failure"] == 2996 and flood["success"] >= 4
    errors = {e["prompt_index"]: e["error_type"] for e in first.jsonl("errors.jsonl")}
    assert sorted(errors.values()) == sorted(FAILED.values())
    stats = first.statistics
    assert (stats["completed"], stats["partial"], stats["failed"]) == (3, 1, 3)
    assert stats["discarded_hallucinated_tools"] == 2

    again = run(entries, *flags, "--resume", batch_size=3, timeout=HUNG * 2)
    assert again.code == 1, again.stderr
    assert len(again.batch_lines) == len(SAVED)  # nothing saved ran again
    kinds = [e["error_type"] for e in again.jsonl("errors.jsonl")]
    assert sorted(kinds) == sorted([*FAILED.values()] * 2) and not any(k.startswith("crash") for k in kinds)
