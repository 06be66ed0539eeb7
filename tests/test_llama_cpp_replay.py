"""The runner against a real llama.cpp server, replayed: tests/fixtures/llama_cpp/ holds what a real
llama-server (CPU build, SmolLM2-135M-Instruct) answered to the runner's own requests, recorded by
bench/record_llama.py through trajforge/mock/recorder.py; trajforge/mock/replay.py serves those bytes
again. The real batch_runner.py runs against the replay, so these tests see the server's own tool-call
ids, stream deltas, error bodies and finish reasons, not the scripted mock's."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import InProcessRunner, Result, calls

from trajforge.mock.recorder import RecordingProxy
from trajforge.mock.replay import TOOL_RESULT, UNMATCHED, ReplayServer, load_fixture, normalized, runner_flags
from trajforge.mock.wire import ThreadedServer, encode_chunk, raw

FIXTURES = Path(__file__).parent / "fixtures" / "llama_cpp"
SCENARIOS = [
    "plain_tool_calls",
    "streamed_tool_calls",
    "think_in_content",
    "length_stop",
    "context_overflow",
    "no_tools_template",
    "token_ids",
    "token_ids_streamed",
]


@dataclass
class Replayed:
    result: Result
    replay: ReplayServer
    fixture: dict


@pytest.fixture
def replayed(tmp_path, monkeypatch):
    """Runs the real batch_runner.py (in this process) against the replay of a fixture, with the flags it
    was recorded with (`drop`: flag names left out; `extra`: flags added); fails on any request that
    matched nothing."""
    import batch_runner  # noqa: F401  (its imports, paid before anything is timed)

    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.endswith("API_KEY")]:
        monkeypatch.delenv(name)

    def run(name: str, *extra: str, drop: tuple[str, ...] = ()) -> Replayed:
        fixture, exchanges = load_fixture(FIXTURES / f"{name}.json")
        replay = ReplayServer(exchanges)
        url = replay.start()
        try:
            flags = [f for f in runner_flags(fixture, url, tmp_path) if f.partition("=")[0] not in drop]
            prompts = [{"prompt": p} for p in fixture["runner"]["prompts"]]
            result = InProcessRunner(tmp_path, None)(prompts, *flags, *extra, batch_size=len(prompts))
        finally:
            replay.stop()
        unmatched = "\n\n".join(f"{s.method} {s.path}:\n{s.diff}" for s in replay.unmatched)
        assert not unmatched, f"requests the recording does not hold:\n{unmatched}"
        return Replayed(result, replay, fixture)

    return run


# -- what the recorded server sent ----------------------------------------------------------------


def chat_replies(fixture: dict) -> list[tuple[int, bytes]]:
    """(status, body) of every recorded chat-completions response, in recorded order."""
    _, exchanges = load_fixture(FIXTURES / f"{fixture['scenario']}.json")
    return [(e.response.status, e.response.body) for e in exchanges if e.path.endswith("/chat/completions")]


def recorded_messages(fixture: dict) -> list[dict]:
    """The assistant message of every successful recorded chat reply, streams put together from their
    deltas here (independently of the runner's own assembly)."""
    messages = []
    for status, body in chat_replies(fixture):
        if status != 200:
            continue
        if body.startswith(b"data: "):
            messages.append(_from_events(body))
        else:
            choice = json.loads(body)["choices"][0]
            messages.append(dict(choice["message"], finish_reason=choice["finish_reason"]))
    return messages


def _from_events(body: bytes) -> dict:
    message: dict = {"content": "", "tool_calls": {}}
    for line in body.decode().split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[len("data: ") :]).get("choices") or []:
            delta = choice.get("delta") or {}
            message["content"] += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                call = message["tool_calls"].setdefault(
                    part["index"], {"id": "", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = part.get("id") or call["id"]
                for key in ("name", "arguments"):
                    call["function"][key] += (part.get("function") or {}).get(key) or ""
            message["finish_reason"] = choice.get("finish_reason") or message.get("finish_reason")
    message["tool_calls"] = [message["tool_calls"][i] for i in sorted(message["tool_calls"])]
    return message


def recorded_calls(fixture: dict) -> list[dict]:
    return [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for m in recorded_messages(fixture)
        for c in m.get("tool_calls") or []
    ]


def saved_calls(result: Result) -> list[dict]:
    return [c for r in result.batch_lines for c in saved_calls_of(r)]


# -- the replay server itself ---------------------------------------------------------------------


def raw_exchange(port: int, method: str, path: str, body) -> bytes:
    """Everything a server sends back to one request on a fresh connection (which the request closes)."""
    data = json.dumps(body).encode() if body != "" else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head.encode() + data)
        received = b""
        while piece := conn.recv(65536):
            received += piece
    return received


@pytest.mark.parametrize("name", ["streamed_tool_calls", "plain_tool_calls", "context_overflow"])
def test_replay_sends_the_recorded_bytes(name):
    _, exchanges = load_fixture(FIXTURES / f"{name}.json")
    replay = ReplayServer(exchanges)
    replay.start()
    try:
        for exchange in exchanges:
            response = exchange.response
            body = response.body
            if response.framing == "chunked":
                body = b"".join(encode_chunk(raw(c)) for c in response.chunks) + encode_chunk(b"")
            got = raw_exchange(replay.port, exchange.method, exchange.path, exchange.body)
            assert got == raw(response.head) + body
    finally:
        replay.stop()
    streams = [e.response for e in exchanges if e.response.headers.get("content-type", "").startswith("text/event")]
    if name == "streamed_tool_calls":  # llama.cpp sends one server-sent event per HTTP chunk
        assert streams and all(len(s.chunks) > 2 for s in streams)
        assert all(c.startswith("data: ") and c.endswith("\n\n") for s in streams for c in s.chunks)


def test_an_unmatched_request_gets_a_loud_599_with_the_diff():
    _, exchanges = load_fixture(FIXTURES / "plain_tool_calls.json")
    replay = ReplayServer(exchanges)
    replay.start()
    chat = next(e for e in exchanges if e.path.endswith("/chat/completions"))
    try:
        changed = dict(chat.body, max_tokens=12345)
        got = raw_exchange(replay.port, "POST", chat.path, changed)
        missing = raw_exchange(replay.port, "GET", "/v1/nothing", "")
    finally:
        replay.stop()
    assert got.startswith(f"HTTP/1.1 {UNMATCHED} ".encode())
    diff = json.loads(got.partition(b"\r\n\r\n")[2])["error"]["diff"]
    assert f'- "max_tokens": {chat.body["max_tokens"]},' in diff
    assert '+ "max_tokens": 12345,' in diff
    assert b"nothing was recorded for GET /v1/nothing" in missing
    assert [s.path for s in replay.unmatched] == [chat.path, "/v1/nothing"]


def test_a_repeated_request_gets_the_same_answer_again():
    _, exchanges = load_fixture(FIXTURES / "context_overflow.json")
    replay = ReplayServer(exchanges)
    failing = next(e for e in exchanges if e.response.status >= 400)
    assert [replay.answer(failing.method, failing.path, failing.body).exchange for _ in range(3)] == [
        exchanges.index(failing)
    ] * 3


def test_only_tool_results_are_left_out_of_the_match():
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "ls"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]},
            {"role": "tool", "tool_call_id": "a", "content": '{"output": "/tmp/xyz"}'},
        ],
    }
    assert normalized(body)["messages"][2] == {"role": "tool", "tool_call_id": "a", "content": TOOL_RESULT}
    assert normalized(body)["messages"][:2] == body["messages"][:2]
    assert normalized("not json") == "not json"
    assert normalized({"messages": "hostile"}) == {"messages": "hostile"}


# -- the recording proxy ---------------------------------------------------------------------------

CHUNKS = [b'data: {"a": 1}\n\n', "data: caf\u00e9".encode()[:-1], "data: caf\u00e9".encode()[-1:] + b"\n\n"]


def chunked_server(size_line=lambda data: f"{len(data):x}".encode()) -> ThreadedServer:
    """A server answering every request with CHUNKS as a chunked body (one split inside a UTF-8
    character), each chunk's size line written by `size_line`."""

    async def answer(reader, writer) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for data in CHUNKS:
            writer.write(size_line(data) + b"\r\n" + data + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    return ThreadedServer(answer)


def test_the_proxy_records_chunks_as_sent_and_the_replay_gives_them_back():
    upstream = chunked_server()
    upstream.start()
    proxy = RecordingProxy("127.0.0.1", upstream.port)
    proxy.start()
    try:
        through_proxy = raw_exchange(proxy.port, "POST", "/v1/chat/completions", {"stream": True})
    finally:
        proxy.stop()
        upstream.stop()
    [exchange] = proxy.exchanges
    assert [raw(c) for c in exchange.response.chunks] == CHUNKS
    assert (exchange.method, exchange.path, exchange.body) == ("POST", "/v1/chat/completions", {"stream": True})
    stored = json.loads(json.dumps(exchange.to_json()))  # a fixture file's round trip
    replay = ReplayServer([type(exchange).from_json(stored)])
    replay.start()
    try:
        assert raw_exchange(replay.port, "POST", "/v1/chat/completions", {"stream": True}) == through_proxy
    finally:
        replay.stop()


def test_the_proxy_refuses_framing_a_replay_could_not_give_back():
    upstream = chunked_server(size_line=lambda data: f"{len(data):X};ext=1".encode())
    upstream.start()
    proxy = RecordingProxy("127.0.0.1", upstream.port)
    proxy.start()
    try:
        raw_exchange(proxy.port, "POST", "/v1/chat/completions", {})
    finally:
        proxy.stop()
        upstream.stop()
    assert proxy.exchanges == []
    assert proxy.problems and "not in the form a replay sends" in proxy.problems[0]


# -- the runner against the replayed llama.cpp server ----------------------------------------------


@pytest.mark.parametrize("name", ["plain_tool_calls", "streamed_tool_calls"])
def test_tool_calls_are_recorded_as_the_server_sent_them(replayed, name):
    run = replayed(name)
    expected = recorded_calls(run.fixture)
    assert expected, "the recording holds no tool call"
    assert saved_calls(run.result) == expected
    tool_turns = "\n".join(
        t["value"] for r in run.result.batch_lines for t in r["conversations"] if t["from"] == "tool"
    )
    for call in expected:
        assert f'"tool_call_id": "{call["id"]}"' in tool_turns
    assert all(r["tool_stats"]["terminal"]["count"] for r in run.result.batch_lines if saved_calls_of(r))


def saved_calls_of(record: dict) -> list[dict]:
    return [c for t in record["conversations"] for c in calls(t)]


def test_think_in_the_content_becomes_the_reasoning(replayed):
    run = replayed("think_in_content")
    contents = [m["content"] for m in recorded_messages(run.fixture)]
    assert contents and all("<think>" in c and "</think>" in c for c in contents)
    records = run.result.batch_lines
    assert len(records) == len(contents) and not any(r.get("discarded") for r in records)
    for record, content in zip(sorted(records, key=lambda r: r["prompt_index"]), contents, strict=True):
        reasoning = content.partition("<think>")[2].partition("</think>")[0].strip()
        answer = content.partition("</think>")[2].strip()
        assert record["conversations"][-1]["value"] == f"<think>\n{reasoning}\n</think>\n{answer}"


def test_a_cut_answer_is_saved_as_the_server_cut_it(replayed):
    run = replayed("length_stop")
    messages = recorded_messages(run.fixture)
    assert messages and all(m["finish_reason"] == "length" for m in messages)
    answers = sorted(r["conversations"][-1]["value"] for r in run.result.batch_lines)
    assert answers == sorted(f"<think>\n\n</think>\n{m['content'].strip()}" for m in messages)


def test_a_cut_answer_ends_the_session_partial_with_exit_reason_length(replayed):
    run = replayed("length_stop")
    records = run.result.batch_lines
    assert records and all(r["metadata"]["exit_reason"] == "length" for r in records)
    assert all(r["partial"] and not r["completed"] for r in records)
    # The turn's finish_reason in the conversation is h17b's uniform turn shape.
    assert all(r["conversations"][-1]["finish_reason"] == "length" for r in records)


def test_the_context_overflow_is_recorded_in_llama_cpp_s_own_words(replayed):
    run = replayed("context_overflow")
    [(status, body)] = [(s, b) for s, b in chat_replies(run.fixture) if s != 200]
    error = json.loads(body)["error"]
    assert (status, error["type"]) == (400, "exceed_context_size_error")
    assert "exceeds the available context size" in error["message"]
    assert run.result.code == 4 and len(run.result.jsonl("errors.jsonl")) == 1  # an overflow: for good


def test_the_context_overflow_fails_the_prompt_at_once(replayed):
    run = replayed("context_overflow", "--max_retries=3", drop=("--max_retries",))
    [error] = run.result.jsonl("errors.jsonl")
    assert (error["error_type"], error["attempts"]) == ("context_length", 1)
    assert "--max_turns" in error["message"]
    failing = [s for s in run.replay.served() if s.status >= 400]
    assert len(failing) == 1  # not retried: the server was asked once


def test_without_a_tools_template_the_model_calls_no_tool(replayed):
    run = replayed("no_tools_template", "--require_reasoning=True")
    requests = [e for e in load_fixture(FIXTURES / "no_tools_template.json")[1] if e.path.endswith("/completions")]
    assert requests and all(e.body.get("tools") for e in requests)  # offered, and dropped by the template
    assert not recorded_calls(run.fixture) and not saved_calls(run.result)
    assert all(r.get("discarded") == "no_reasoning" for r in run.result.batch_lines)
    assert run.result.trajectories == []


def test_without_a_tools_template_the_run_says_tools_may_not_be_supported(replayed):
    run = replayed("no_tools_template", "--require_reasoning=True")
    said = " ".join((run.result.stdout + run.result.stderr).split())
    assert "may not support tool calling" in said
    assert "--require_reasoning=False" in said


def test_token_ids_are_the_completion_ids_llama_cpp_sent(replayed):
    run = replayed("token_ids", "--require_reasoning=False")  # as recorded: the 135M model does not reason
    assert run.result.code == 0, run.result.stdout + run.result.stderr
    requests = [e.body for e in load_fixture(FIXTURES / "token_ids.json")[1] if e.path.endswith("/chat/completions")]
    assert requests and all(body.get("logprobs") is True for body in requests)
    lines = run.result.jsonl("tokens.jsonl")
    assert len(lines) == len(run.result.trajectories) > 0
    turns = [turn for line in lines for turn in line["turns"]]
    assert turns and all(turn["prompt_token_ids"] is None for turn in turns)  # chat completions give none
    assert all(turn["token_ids"] and len(turn["token_ids"]) == len(turn["logprobs"]) for turn in turns)
    completion = sum(r["metadata"]["usage"]["completion_tokens"] for r in run.result.trajectories)
    assert sum(len(turn["token_ids"]) for turn in turns) == completion
    sent = [  # the ids as the server wrote them, reply by reply
        [entry["id"] for entry in json.loads(body)["choices"][0]["logprobs"]["content"]]
        for status, body in chat_replies(run.fixture)
        if status == 200
    ]
    assert sorted(map(tuple, sent)) == sorted(tuple(turn["token_ids"]) for turn in turns)
    assert run.result.stderr.count("without token ids") == 1  # said once, naming what the reply lacked


def test_llama_cpp_refuses_logprobs_with_tools_when_streamed_and_the_prompt_fails_at_once(replayed):
    run = replayed("token_ids_streamed", "--require_reasoning=False")
    errors = run.result.jsonl("errors.jsonl")
    assert run.result.code == 4 and len(errors) == len(run.fixture["runner"]["prompts"])  # 400s: for good
    assert all(e["attempts"] == 1 and "logprobs is not supported with tools + stream" in e["message"] for e in errors)


def test_the_model_name_the_server_reports_is_kept(replayed):
    run = replayed("plain_tool_calls")
    reported = {json.loads(b)["model"] for s, b in chat_replies(run.fixture) if s == 200}
    assert reported == {"smollm2-135m"}
    assert {r["metadata"]["model_reported"] for r in run.result.batch_lines} == reported


def test_every_fixture_says_which_server_answered():
    names = sorted(path.stem for path in FIXTURES.glob("*.json"))
    assert names == sorted(SCENARIOS)
    for name in names:
        fixture, exchanges = load_fixture(FIXTURES / f"{name}.json")
        assert fixture["server"]["version"][0].startswith("version: ")
        assert fixture["server"]["command"][0] == "llama-server" and "127.0.0.1" in fixture["server"]["command"]
        assert all(e.response.headers.get("server") == "llama.cpp" for e in exchanges)
