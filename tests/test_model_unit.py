"""The model client's pure parts, in-process: reasoning extraction, stream assembly, the reading of a
reply, Retry-After parsing, the retry classification and usage accounting."""

from __future__ import annotations

import httpx
import openai
import pytest

from trajectory import split_reasoning
from trajforge.model.retry import NOT_OURS, RETRY_AFTER_CAP, BadReply, Decision, classify, retry_after
from trajforge.model.stream import answer, assemble, merge_fragment, merge_tool_call
from trajforge.model.usage import add_usage, empty_usage

# -- split_reasoning --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_split_reasoning_reads_a_native_field(field):
    assert split_reasoning({field: " I think. ", "content": " The answer. "}) == ("I think.", "The answer.")


def test_split_reasoning_joins_reasoning_details_texts_and_summaries():
    details = [
        {"type": "reasoning.text", "text": "first"},
        {"type": "reasoning.summary", "summary": "second"},
        {"type": "reasoning.encrypted", "data": "opaque"},
        "not an object",
    ]
    assert split_reasoning({"reasoning_details": details, "content": "done"}) == ("first\nsecond", "done")


def test_split_reasoning_takes_the_first_native_field_only():
    message = {
        "reasoning": "once",
        "reasoning_content": "once",
        "reasoning_details": [{"type": "reasoning.text", "text": "once"}],
        "content": "x",
    }
    assert split_reasoning(message) == ("once", "x")
    blank_first = {"reasoning": "  ", "reasoning_content": "second field", "content": "x"}
    assert split_reasoning(blank_first) == ("second field", "x")


@pytest.mark.parametrize("tag", ["think", "REASONING_SCRATCHPAD"])
def test_split_reasoning_takes_tagged_reasoning_out_of_the_content(tag):
    content = f"<{tag}>\nstep one\n</{tag}>\nThe answer."
    assert split_reasoning({"content": content}) == ("step one", "The answer.")


def test_split_reasoning_reads_a_lone_closing_think_tag():
    # Chat templates that open <think> in the prompt leave only its end in the reply.
    assert split_reasoning({"content": "pondering\n</think>\n\nThe answer."}) == ("pondering", "The answer.")


def test_split_reasoning_keeps_native_and_tagged_reasoning_both():
    message = {"reasoning": "native", "content": "<think>tagged</think>answer"}
    assert split_reasoning(message) == ("native\ntagged", "answer")


def test_split_reasoning_reads_a_list_of_content_parts():
    parts = [{"type": "text", "text": "<think>a</think>"}, {"type": "text", "text": "b"}, "junk", {"type": "image"}]
    assert split_reasoning({"content": parts}) == ("a", "b")


def test_split_reasoning_of_an_empty_message():
    assert split_reasoning({"content": None}) == ("", "")
    assert split_reasoning({}) == ("", "")


# -- stream assembly --------------------------------------------------------------------------------


def chunk(delta: dict | None = None, finish: str | None = None, **extra) -> dict:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"object": "chat.completion.chunk", "choices": [choice]} | extra


def test_assemble_joins_content_and_reasoning_pieces_and_keeps_the_usage():
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    reply = assemble(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning": "Let me "}),
            chunk({"reasoning": "think.", "reasoning_content": "Same."}),
            chunk({"content": "Hello, "}),
            chunk({"content": "world."}),
            chunk({}, "stop"),
            {"choices": [], "usage": usage},
        ]
    )
    assert reply["usage"] == usage
    assert reply["choices"][0]["finish_reason"] == "stop"
    message = answer(reply)
    assert message == {
        "role": "assistant",
        "content": "Hello, world.",
        "reasoning": "Let me think.",
        "reasoning_content": "Same.",
    }


def test_assemble_builds_indexed_tool_calls_from_interleaved_pieces():
    reply = assemble(
        [
            chunk({"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "terminal"}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "read_", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command": '}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"name": "file", "arguments": '{"path": "x"}'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    assert answer(reply)["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}},
        {"id": "b", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "x"}'}},
    ]


def test_merge_tool_call_without_index_follows_the_ids():
    calls: dict[int, dict] = {}
    for part in (
        {"id": "a", "function": {"name": "terminal", "arguments": '{"comm'}},
        {"function": {"arguments": 'and": "ls"}'}},  # no id: the last call goes on
        {"id": "b", "function": {"name": "read_file", "arguments": "{}"}},  # a new id: a new call
        {"id": "a", "function": {"arguments": ""}},  # a known id: back to that call
    ):
        merge_tool_call(calls, part)
    assert calls == {
        0: {"id": "a", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}},
        1: {"id": "b", "type": "function", "function": {"name": "read_file", "arguments": "{}"}},
    }


def test_merge_tool_call_without_any_id_makes_one_call():
    calls: dict[int, dict] = {}
    merge_tool_call(calls, {"function": {"name": "terminal"}})
    merge_tool_call(calls, {"function": {"arguments": "{}"}})
    assert calls == {0: {"id": "", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}}


def test_assemble_merges_reasoning_details_fragments_by_index():
    pieces = [
        [{"type": "reasoning.text", "text": "Step ", "format": "unknown", "index": 0}],
        [{"type": "reasoning.text", "text": "one.", "index": 0, "signature": "s1"}],
        [{"type": "reasoning.text", "index": 0, "signature": "s2", "format": None}],  # None keeps what came
        [{"type": "reasoning.encrypted", "data": "AAA", "index": 1}],
        [{"data": "BBB", "index": 1}, "junk"],
    ]
    reply = assemble([*(chunk({"reasoning_details": details}) for details in pieces), chunk({"content": "ok"}, "stop")])
    assert answer(reply)["reasoning_details"] == [
        {"type": "reasoning.text", "text": "Step one.", "format": "unknown", "index": 0, "signature": "s1s2"},
        {"type": "reasoning.encrypted", "data": "AAABBB", "index": 1},
    ]


def test_merge_fragment_without_index_starts_a_new_item():
    merged: dict[int, dict] = {}
    merge_fragment(merged, None, {"text": "a"}, ("text",))
    merge_fragment(merged, None, {"text": "b"}, ("text",))
    assert merged == {0: {"text": "a"}, 1: {"text": "b"}}


def test_assemble_skips_what_is_not_an_object_and_needs_a_choice():
    reply = assemble(["junk", {"choices": "junk"}, {"choices": [1, {"delta": "junk"}, {"delta": {"content": "x"}}]}])
    assert answer(reply)["content"] == "x"
    with pytest.raises(BadReply, match="without any choice"):
        assemble([{"choices": [], "usage": {"total_tokens": 1}}])
    with pytest.raises(BadReply):
        assemble([])


def test_assemble_keeps_an_error_sent_in_a_choice_and_answer_refuses_it():
    error = {"delta": {}, "finish_reason": "error", "error": {"message": "upstream boom"}}
    streamed = assemble([chunk({"content": "partial"}), {"choices": [error]}])
    assert streamed["choices"][0]["finish_reason"] == "error"
    assert streamed["choices"][0]["error"] == {"message": "upstream boom"}
    with pytest.raises(BadReply, match="upstream boom"):
        answer(streamed)


# -- answer: a 200 without a usable choice ----------------------------------------------------------


def test_answer_returns_the_message_of_the_first_choice():
    message = {"role": "assistant", "content": "hi"}
    assert answer({"choices": [{"message": message, "finish_reason": "stop"}, {"message": {}}]}) is message


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"choices": []},
        {"choices": "none"},
        {"choices": ["junk"]},
        {"choices": [{"message": None}]},
        {"choices": [{"message": "text"}]},
        {"choices": [{"message": {"content": ""}, "finish_reason": "error"}]},
        {"choices": [{"message": {"content": "x"}, "error": {"code": 502}}]},
        {"error": {"message": "Provider returned error", "code": 502}},
    ],
)
def test_answer_refuses_a_reply_without_a_usable_choice(data):
    with pytest.raises(BadReply, match="reply without an answer"):
        answer(data)


def test_answer_names_the_error_of_the_body():
    with pytest.raises(BadReply, match="Provider returned error"):
        answer({"error": {"message": "Provider returned error"}})


# -- Retry-After ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"Retry-After": "0.5"}, 0.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # the precise one wins
        ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
        ({"retry-after": "100000"}, RETRY_AFTER_CAP),
        ({"retry-after-ms": "999999999"}, RETRY_AFTER_CAP),
        ({"retry-after": "-5"}, 0.0),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": ""}, None),
        ({}, None),
    ],
)
def test_retry_after(headers, seconds):
    assert retry_after(headers) == seconds
    assert retry_after(httpx.Headers(headers)) == seconds


# -- classify ---------------------------------------------------------------------------------------

REQUEST = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def status_error(status: int, message: str = "injected fault", headers: dict | None = None) -> openai.APIStatusError:
    response = httpx.Response(status, headers=headers or {}, request=REQUEST)
    return openai.APIStatusError(f"Error code: {status} - {message}", response=response, body=None)


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_classify_retries_rate_limits_conflicts_and_server_errors(status):
    assert classify(status_error(status)) == Decision(True, False, f"http_{status}", None)


def test_classify_honours_the_wait_the_server_asks_for():
    assert classify(status_error(429, headers={"Retry-After": "7"})).retry_after == 7.0
    assert classify(status_error(503, headers={"retry-after-ms": "1500"})).retry_after == 1.5
    assert classify(status_error(429, headers={"Retry-After": "86400"})).retry_after == RETRY_AFTER_CAP


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_classify_fails_the_prompt_on_client_errors(status):
    assert classify(status_error(status, headers={"retry-after": "1"})) == Decision(False, False, f"http_{status}")


@pytest.mark.parametrize("status", [401, 402, 403])
def test_classify_stops_the_run_when_refused(status):
    assert classify(status_error(status)) == Decision(False, True, f"http_{status}")


@pytest.mark.parametrize("message", ["Your input was flagged by moderation", "MODERATION: blocked"])
def test_classify_fails_only_the_prompt_on_a_403_for_flagged_input(message):
    assert classify(status_error(403, message)) == Decision(False, False, "http_403")
    assert classify(status_error(401, message)).stop_run  # a flagged 401 is still a refused key


def test_classify_retries_timeouts_broken_connections_and_bad_replies():
    assert classify(openai.APITimeoutError(REQUEST)) == Decision(True, False, "timeout")
    assert classify(openai.APIConnectionError(request=REQUEST)) == Decision(True, False, "connection")
    stream_error = openai.APIError("An error occurred during streaming", REQUEST, body=None)
    assert classify(stream_error) == Decision(True, False, "bad_reply")
    assert classify(BadReply("reply without an answer")) == Decision(True, False, "bad_reply")


@pytest.mark.parametrize("exc", [ValueError("a bug"), KeyError("choices"), RuntimeError()])
def test_classify_leaves_other_exceptions_alone(exc):
    assert classify(exc) == Decision(False, False, NOT_OURS)


# -- usage ------------------------------------------------------------------------------------------


def test_add_usage_sums_tokens_reasoning_details_and_cost():
    total = empty_usage()
    add_usage(total, {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "cost": 0.5})
    add_usage(total, {"prompt_tokens": 1, "completion_tokens_details": {"reasoning_tokens": 3}, "cost": None})
    add_usage(total, {})
    assert total == {  # a call whose cost nobody knows makes the prompt's cost unknown, never a smaller sum
        "prompt_tokens": 11,
        "completion_tokens": 4,
        "total_tokens": 15,  # the second reply's own total (1), taken from its parts
        "reasoning_tokens": 3,
        "cached_tokens": 0,
        "cost": None,
        "judge_tokens": 0,  # no judge call among them
        "judge_cost": 0.0,
    }
