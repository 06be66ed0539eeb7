"""The agent loop in-process: a real ModelClient against the scripted model's server on 127.0.0.1, and
real tools in a real local environment. The prompt's [mock ...] directives steer the replies and inject
faults (trajforge/mock/model.py)."""

from __future__ import annotations

import json

import pytest
from agent_run import OFFERED, agent, calls

from trajforge.agent.loop import AgentResult
from trajforge.model.outcomes import ModelCallFailed, RunStopped


def test_runs_the_tool_calls_and_completes_on_a_reply_without_calls(server):
    result = agent(server, "take notes")
    assert calls(result) == [["terminal", "write_file"], ["read_file"], []]
    assert (result.exit_reason, result.api_calls, result.retries) == ("completed", 3, 0)
    terminal, write = result.turns[0].calls
    assert terminal.ok and terminal.result["output"].startswith("mock-model-was-here\n")
    assert write.ok and json.loads(write.arguments) == {"path": "notes.txt", "content": "Task: take notes\n"}
    assert "Task: take notes" in result.turns[1].calls[0].result["content"]  # the file the first turn wrote
    assert result.turns[0].reasoning.startswith("Turn 1:") and result.turns[0].content == ""
    assert result.turns[-1].content.startswith("Here is my answer to 'take notes'")
    usage = result.usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert usage["reasoning_tokens"] > 0 and usage["cost"] > 0


def test_sends_the_calls_back_with_their_results_matched_by_id(server):
    result = agent(server, "take notes", preamble=[{"role": "system", "content": "Be brief."}])
    requests = [r["body"] for r in server.chat_requests()]
    assert len(requests) == 3
    assert all(body["messages"][0] == {"role": "system", "content": "Be brief."} for body in requests)
    assert {t["function"]["name"] for t in requests[0]["tools"]} == set(OFFERED)
    _, user, assistant, *results = requests[1]["messages"]
    assert user == {"role": "user", "content": "take notes"}
    turn = result.turns[0]
    assert assistant == {
        "role": "assistant",
        "content": "",  # the reasoning stays out of the content sent back
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in turn.calls
        ],
    }
    assert results == [{"role": "tool", "tool_call_id": c.id, "content": json.dumps(c.result)} for c in turn.calls]


def test_reasoning_details_are_echoed_back(server):
    result = agent(server, "details [mock reasoning=reasoning_details turns=1]")
    first, second = (r["body"] for r in server.chat_requests())
    thought = result.turns[0].reasoning
    assert thought.startswith("Turn 1:") and "reasoning_details" not in first["messages"][-1]
    echoed = second["messages"][1]
    assert echoed["role"] == "assistant" and echoed["content"] == ""
    assert echoed["reasoning_details"] == [{"type": "reasoning.text", "text": thought, "format": "unknown", "index": 0}]


def test_max_turns_stops_a_partial_run(server):
    result = agent(server, "keep going [mock turns=9]", max_turns=2)
    assert (result.exit_reason, result.api_calls, len(result.turns)) == ("max_turns", 2, 2)
    assert all(turn.calls for turn in result.turns)
    assert len(server.chat_requests()) == 2


def test_an_unknown_tool_is_answered_as_an_error_and_the_loop_goes_on(server):
    result = agent(server, "dreamer [mock unknown_tool]")
    unknown = result.turns[0].calls[0]
    assert unknown.name == "hallucinated_tool" and not unknown.ok
    assert unknown.result["error"].startswith("unknown tool 'hallucinated_tool'; the tools you can call are: ")
    assert result.turns[0].calls[1].ok  # the other call of the turn still ran
    assert result.exit_reason == "completed"


def test_arguments_that_are_not_json_are_answered_as_an_error(server):
    result = agent(server, "broken json [mock bad_json]")
    broken = result.turns[0].calls[0]
    assert broken.arguments == '{"command": "echo broken'  # kept as the model sent them
    assert "not valid JSON" in broken.result["error"]
    assert result.exit_reason == "completed"


def test_a_429_is_retried_after_the_wait_the_server_asked(server):
    prompt = "busy [mock fail=429 times=1 retry_after=0.1 turns=1]"
    log: list[str] = []
    result = agent(server, prompt, log=log)
    assert (result.exit_reason, result.api_calls, result.retries) == ("completed", 2, 1)
    assert [r["status"] for r in server.chat_requests()] == [429, 200, 200]
    assert server.attempts[prompt] == 3
    assert any(line.startswith("retry 1/2 in 0.1s: Error code: 429") for line in log)


def test_the_log_shows_each_turn_and_each_result(server):
    log: list[str] = []
    agent(server, "talk [mock turns=1]", log=log)
    assert log[0].startswith("turn 1 (tool calls: terminal, write_file): Turn 1: to make progress")
    assert log[1].startswith('  terminal result: {"output": "mock-model-was-here')
    assert log[2].startswith("  write_file result: ")
    assert log[3].startswith("turn 2 (tool calls: none): Here is my answer")


def test_a_refused_key_stops_the_run(server):
    server.api_key = "the-right-key"
    with pytest.raises(RunStopped, match=r"the API key was refused \(HTTP 401 from http://127\.0\.0\.1"):
        agent(server, "anything")
    assert [r["status"] for r in server.requests] == [401]  # never retried


@pytest.mark.parametrize(
    ("directive", "kind", "attempts"),
    [
        ("fail=400", "http_400", 1),
        ("fail=403 flagged", "http_403", 1),  # moderation flagged this input: only this prompt fails
        ("fail=500 retry_after=0", "http_500", 3),  # out of retries
    ],
)
def test_failures_that_fail_the_prompt(server, directive, kind, attempts):
    with pytest.raises(ModelCallFailed) as failed:
        agent(server, f"failing [mock {directive}]")
    assert (failed.value.kind, failed.value.attempts) == (kind, attempts)
    assert len(server.requests) == attempts


@pytest.mark.parametrize(
    ("directive", "named"),
    [
        ("turn=3 reasonning=none fial=429", "unknown mock directive turn, reasonning, fial; known: alternate"),
        ("reasoning=thinking", "reasoning=thinking: one of reasoning, reasoning_content"),
        ("fail=often", "fail=often: not a number"),
        ("bad_json=1", "'bad_json' takes no value"),
    ],
)
def test_a_misspelt_directive_is_refused_naming_it(server, directive, named):
    # Parsed as defaults, a misspelt directive would let a test pass without testing anything.
    with pytest.raises(ModelCallFailed) as failed:
        agent(server, f"steered [mock {directive}]")
    assert (failed.value.kind, failed.value.attempts) == ("http_400", 1)
    assert named in str(failed.value)


def test_a_request_past_its_timeout_fails_as_a_timeout(server):
    with pytest.raises(ModelCallFailed) as failed:
        agent(server, "slow [mock latency=3]", request_timeout=0.3, max_retries=0)
    assert (failed.value.kind, failed.value.attempts) == ("timeout", 1)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fault", ["upstream_error", "empty"])
def test_a_200_without_an_answer_is_retried(server, fault, stream):
    result = agent(server, f"hiccup [mock {fault} times=1 turns=0]", stream=stream)
    assert (result.exit_reason, result.api_calls, result.retries) == ("completed", 1, 1)
    assert result.turns[0].content.startswith("Here is my answer")


@pytest.mark.parametrize("reasoning", ["reasoning_content", "reasoning_details", "all", "think"])
def test_streaming_gives_the_same_turns(server, reasoning):
    prompt = f"stream it [mock reasoning={reasoning}]"
    plain = agent(server, prompt)
    streamed = agent(server, prompt, stream=True)
    assert [bool(r["body"].get("stream")) for r in server.chat_requests()] == [False] * 3 + [True] * 3

    def shape(result: AgentResult) -> list:
        return [
            (turn.content, turn.reasoning, [(c.id, c.name, c.arguments, c.ok) for c in turn.calls])
            for turn in result.turns
        ]

    assert shape(streamed) == shape(plain)
    assert streamed.exit_reason == plain.exit_reason == "completed"
    # What went back to the model (reasoning_details included) is the same too, tool results aside.
    sent = [[m for m in r["body"]["messages"] if m["role"] == "assistant"] for r in server.chat_requests()]
    assert sent[:3] == sent[3:]
