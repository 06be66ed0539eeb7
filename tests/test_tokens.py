"""--token_ids: the ids and logprobs the server sent for every turn, kept in tokens.jsonl, checked for
continuity, and turned into RL rows (--export=rl). The scripted server answers as vLLM does when asked
(trajforge/mock/tokens.py: one fake token per byte of a rendered template), so every id the runner
keeps can be computed again from the server's own request log."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from agent_run import agent
from conftest import source

from trajectory import Turn, split_reasoning
from trajforge.agent.calls import read_tool_calls
from trajforge.export.rl import segments
from trajforge.flags.values import token_mode
from trajforge.mock import tokens as mock_tokens
from trajforge.model.echo import exact_message, read_message
from trajforge.model.stream import assemble
from trajforge.model.tokens import drift, turn_tokens

ROOT = Path(__file__).resolve().parents[1]
ONE_SLOT = ["--distribution=terminal_only", "--environment=local", "--num_workers=1", "--concurrency=1"]
TOKEN_KEYS = {"return_token_ids", "logprobs"}
TOKEN_FIELDS = ("prompt_token_ids", "token_ids", "logprobs")


def prompt_ids(server) -> list[list[int]]:
    """The prompt ids of each chat request of the server's log, computed again from the request."""
    return [
        mock_tokens.ids(mock_tokens.render(r["body"]["messages"], r["body"].get("tools")))
        for r in server.chat_requests()
    ]


# -- pure functions ------------------------------------------------------------------------------------


def test_token_mode_reads_the_flag_as_fire_hands_it_over():
    assert [token_mode(v) for v in (None, False, True, "true", "on", "required", "false")] == [
        "off",
        "off",
        "on",
        "on",
        "on",
        "required",
        "off",
    ]
    with pytest.raises(Exception, match="--token_ids must be true, false or required"):
        token_mode("sometimes")


def test_turn_tokens_reads_vllm_and_llama_cpp_replies():
    vllm = {
        "prompt_token_ids": [1, 2],
        "choices": [{"message": {}, "token_ids": [7, 8], "logprobs": {"content": [{"logprob": -0.5}] * 2}}],
    }
    assert turn_tokens(vllm) == ({"prompt_token_ids": [1, 2], "token_ids": [7, 8], "logprobs": [-0.5, -0.5]}, "")
    # llama.cpp: no return_token_ids, but each chat logprobs entry carries its token's id
    llama = {"choices": [{"message": {}, "logprobs": {"content": [{"id": 5, "token": "a", "logprob": -1.0}]}}]}
    found, missing = turn_tokens(llama)
    assert found == {"prompt_token_ids": None, "token_ids": [5], "logprobs": [-1.0]}
    assert missing.startswith("the reply had no prompt_token_ids (its fields: choices; choices[0]: logprobs, message)")
    plain = {"id": "x", "choices": [{"message": {}, "finish_reason": "stop"}]}
    assert turn_tokens(plain)[0] == {"prompt_token_ids": None, "token_ids": None, "logprobs": None}
    hostile = {
        "prompt_token_ids": "1 2",
        "choices": [{"token_ids": [1, True], "logprobs": {"content": [{"logprob": "low"}, 3]}}],
    }
    assert turn_tokens(hostile)[0] == dict.fromkeys(TOKEN_FIELDS)
    assert turn_tokens({"choices": "none"})[0] == dict.fromkeys(TOKEN_FIELDS)


def test_streamed_chunks_are_joined_and_hostile_ones_ignored():
    chunks = [
        {"prompt_token_ids": [1, 2], "choices": [{"delta": {"content": "a"}, "token_ids": [5]}]},
        {"prompt_token_ids": [9], "choices": [{"delta": {"content": "b"}, "token_ids": [6, 7]}, "junk"]},
        {"choices": [{"delta": {}, "token_ids": "8", "logprobs": {"content": "x"}}]},
    ]
    data = assemble(chunks)
    assert data["prompt_token_ids"] == [1, 2] and data["choices"][0]["token_ids"] == [5, 6, 7]
    assert data["choices"][0]["message"]["content"] == "ab" and "logprobs" not in data["choices"][0]
    assert "prompt_token_ids" not in assemble([{"choices": [{"delta": {"content": "a"}}]}])  # a plain stream


def test_segments_split_where_the_prompt_ids_do_not_go_on():
    turns = [
        {"prompt_token_ids": [1, 2], "token_ids": [3], "logprobs": [-0.3]},
        {"prompt_token_ids": [1, 2, 3, 9, 9], "token_ids": [4, 5], "logprobs": [-0.4, -0.5]},
        {"prompt_token_ids": [1, 2, 7], "token_ids": [6], "logprobs": [-0.6]},  # drifted
        {"prompt_token_ids": None, "token_ids": None, "logprobs": None},
        {"prompt_token_ids": [8], "token_ids": [9], "logprobs": None},
    ]
    assert drift(turns) == [3]
    first, second, third = segments(turns)
    assert first == {
        "prompt_ids": [1, 2],
        "response_ids": [3, 9, 9, 4, 5],
        "response_mask": [1, 0, 0, 1, 1],
        "response_logprobs": [-0.3, 0.0, 0.0, -0.4, -0.5],
    }
    assert second["prompt_ids"] == [1, 2, 7] and second["response_mask"] == [1]
    assert third == {"prompt_ids": [8], "response_ids": [9], "response_mask": [1], "response_logprobs": [0.0]}


@pytest.mark.parametrize("reasoning", ["reasoning", "reasoning_content", "think"])
def test_the_exact_echo_keeps_the_template_append_only_and_the_plain_one_does_not(reasoning):
    """Why --token_ids sends replies back as written: the plain echo drops the reasoning and the
    <think> block, so a template that renders them sees other tokens than the model wrote."""
    request = {"messages": [{"role": "user", "content": "hi"}], "tools": []}
    message = {
        "role": "assistant",
        "content": "<think>why</think>\nI will look" if reasoning == "think" else "I will look",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": '{"a":1}'}}],
    }
    if reasoning != "think":
        message[reasoning] = "why"
    prompt, completion = mock_tokens.of_reply(request, message, drift=False)
    thought, content = split_reasoning(message)
    turn = Turn(content, thought, [call for call, _ in read_tool_calls(message, 1, 32)])
    tool = {"role": "tool", "tool_call_id": "c1", "content": "{}"}
    for echo, drifts in ((exact_message, False), (read_message, True)):
        following = {"messages": [*request["messages"], echo(message, turn), tool], "tools": []}
        again = mock_tokens.ids(mock_tokens.render(following["messages"], []))
        assert (again[: len(prompt) + len(completion)] != prompt + completion) is drifts, echo.__name__


def test_streamed_ids_arrive_in_chunks_and_add_up_to_the_plain_ones(server):
    plain = agent(server, "take notes", token_ids="on")
    streamed = agent(server, "take notes", token_ids="on", stream=True)
    # the same first request gets the same reply (later ones carry tool results that differ: the workspace)
    assert plain.tokens[0] == streamed.tokens[0] and len(plain.tokens) == len(streamed.tokens) == 3
    assert all(len(t["logprobs"]) == len(t["token_ids"]) > 0 for t in plain.tokens)
    stream_request = server.chat_requests()[-1]["body"]
    assert stream_request["stream"] and set(stream_request) >= TOKEN_KEYS
    assert drift(plain.tokens) == drift(streamed.tokens) == []
    # the ids are the server's: the prompt as its template rendered the request it received
    assert [t["prompt_token_ids"] for t in streamed.tokens] == prompt_ids(server)[3:]


# -- whole runs ----------------------------------------------------------------------------------------


def test_a_plain_run_sends_what_it_always_sent(run_here, server):
    result = run_here([{"prompt": "take notes"}], *ONE_SLOT)
    assert result.code == 0, result.stdout + result.stderr
    bodies = [r["body"] for r in server.chat_requests()]
    assert len(bodies) == 3 and all(set(body) == {"model", "messages", "tools"} for body in bodies)
    echoed = bodies[1]["messages"][1]
    assert set(echoed) == {"role", "content", "tool_calls"} and echoed["content"] == ""  # reasoning stays out
    assert not (result.run_dir / "tokens.jsonl").exists()
    (record,) = result.trajectories
    assert record["metadata"]["token_drift"] == "[]" and "tokens" not in record
    assert result.statistics["token_ids"] == {
        "samples": 0,
        "turns": 0,
        "turns_without_ids": 0,
        "drifted_turns": 0,
        "samples_with_drift": 0,
    }


def test_token_ids_refuse_the_never_saved_system_prompt(run_here, server):
    # Prompt ids are what the model saw: they would keep the ephemeral system prompt a run never saves.
    result = run_here([{"prompt": "p"}], *ONE_SLOT, "--token_ids", "--ephemeral_system_prompt=SECRET-RULES")
    assert result.code == 2 and "--ephemeral_system_prompt" in result.stderr
    assert server.chat_requests() == []


def test_tokens_jsonl_and_rl_rows_hold_what_the_server_sent(run_here, server):
    entries = [{"prompt": "take notes"}, {"prompt": "again [mock turns=2]"}, {"prompt": "shifty [mock template=drift]"}]
    result = run_here(entries, *ONE_SLOT, "--token_ids", "--export=rl,parquet", batch_size=2)
    assert result.code == 0, result.stdout + result.stderr
    assert all(set(r["body"]) >= TOKEN_KEYS and r["body"]["return_token_ids"] for r in server.chat_requests())
    trajectories, tokens = result.trajectories, result.jsonl("tokens.jsonl")
    assert [(t["prompt_index"], t["metadata"]["sample_index"]) for t in trajectories] == [
        (line["prompt_index"], line["sample_index"]) for line in tokens
    ]
    assert all("tokens" not in t for t in trajectories)
    assert "| `--token_ids` | on |" in (result.run_dir / "README.md").read_text()  # the dataset card names the flag
    assert [len(line["turns"]) for line in tokens] == [t["api_calls"] for t in trajectories]
    by_prompt = {source(t)["prompt"]: (t, line) for t, line in zip(trajectories, tokens, strict=True)}
    assert len(server.chat_requests()) == sum(t["api_calls"] for t in trajectories)
    for prompt, (record, line) in by_prompt.items():
        sent = [r["body"] for r in server.chat_requests() if r["prompt"] == prompt]
        drifting = "template=drift" in prompt
        rendered = [mock_tokens.ids(mock_tokens.render(b["messages"], b["tools"], drifting)) for b in sent]
        assert [turn["prompt_token_ids"] for turn in line["turns"]] == rendered  # as the server sent them
        assert all(len(turn["logprobs"]) == len(turn["token_ids"]) for turn in line["turns"])
        assert record["metadata"]["token_drift"] == ("[2, 3]" if drifting else "[]")

    rows = result.jsonl("export/rl.jsonl")
    assert Counter(row["prompt_index"] for row in rows) == Counter({0: 1, 1: 1, 2: 3})  # the drifting one, split
    assert all(row["reward"] is None for row in rows)  # unverified: null, not the record's 0.0 placeholder
    _, notes = by_prompt["take notes"]
    (row,) = [row for row in rows if row["prompt_index"] == 0]
    last = notes["turns"][-1]
    assert row["prompt_ids"] == notes["turns"][0]["prompt_token_ids"] and row["segment"] == 0
    assert row["prompt_ids"] + row["response_ids"] == last["prompt_token_ids"] + last["token_ids"]
    assert sum(row["response_mask"]) == sum(len(turn["token_ids"]) for turn in notes["turns"])
    assert len(row["response_logprobs"]) == len(row["response_ids"]) == len(row["response_mask"])
    generated = [lp for lp, mask in zip(row["response_logprobs"], row["response_mask"], strict=True) if mask]
    assert generated == [lp for turn in notes["turns"] for lp in turn["logprobs"]]
    assert all(lp == 0.0 for lp, mask in zip(row["response_logprobs"], row["response_mask"], strict=True) if not mask)
    split = [row for row in rows if row["prompt_index"] == 2]
    _, shifty = by_prompt["shifty [mock template=drift]"]
    assert [row["segment"] for row in split] == [0, 1, 2]
    assert [row["prompt_ids"] for row in split] == [turn["prompt_token_ids"] for turn in shifty["turns"]]
    assert result.statistics["token_ids"] == {
        "samples": 3,
        "turns": len(server.chat_requests()),
        "turns_without_ids": 0,
        "drifted_turns": 2,
        "samples_with_drift": 1,
    }

    datasets = pytest.importorskip("datasets")
    for name in ("rl.jsonl", "rl.parquet"):
        kind = "parquet" if name.endswith("parquet") else "json"
        loaded = datasets.load_dataset(kind, data_files=str(result.run_dir / "export" / name), split="train")
        assert loaded.num_rows == 5 and loaded[0]["response_mask"] == rows[0]["response_mask"]
    loaded = datasets.load_dataset("json", data_files=str(result.run_dir / "tokens.jsonl"), split="train")
    assert loaded.num_rows == 3


def test_replies_from_the_response_cache_keep_their_ids(run_here, server):
    first = run_here([{"prompt": "take notes"}], *ONE_SLOT, "--token_ids")
    assert first.code == 0, first.stdout + first.stderr
    before = first.jsonl("tokens.jsonl")
    asked = len(server.chat_requests())
    for path in first.run_dir.glob("batch_*.jsonl"):  # as if the run had been cut off before its line
        path.unlink()
    (first.run_dir / "checkpoint.json").unlink()
    again = run_here([{"prompt": "take notes"}], *ONE_SLOT, "--resume")  # --token_ids kept in run.json
    assert again.code == 0, again.stdout + again.stderr
    assert len(server.chat_requests()) == asked  # every reply from the cache
    assert again.jsonl("tokens.jsonl") == before and before[0]["turns"][0]["token_ids"]


def test_the_merge_keeps_the_same_selection_in_tokens_jsonl(run_here, server):
    entries = [{"prompt": "a [mock reasoning=none]"}, {"prompt": "b [mock turns=1]"}, {"prompt": "c [mock turns=0]"}]
    result = run_here(entries, *ONE_SLOT, "--token_ids")
    assert result.code == 0, result.stdout + result.stderr
    assert [source(t)["prompt"] for t in result.trajectories] == ["b [mock turns=1]", "c [mock turns=0]"]
    assert [line["prompt_index"] for line in result.jsonl("tokens.jsonl")] == [1, 2]


def test_a_server_without_ids_is_named_once_and_leaves_nulls(run_here, server):
    entries = [{"prompt": "a [mock no_token_ids turns=1]"}, {"prompt": "b [mock no_token_ids turns=1]"}]
    result = run_here(entries, *ONE_SLOT, "--token_ids")
    assert result.code == 0, result.stdout + result.stderr
    warning = "answered without token ids: the reply had no prompt_token_ids, token_ids, logprobs (its fields:"
    assert result.stderr.count(warning) == 1, result.stderr
    lines = result.jsonl("tokens.jsonl")
    assert [turn for line in lines for turn in line["turns"]] == [dict.fromkeys(TOKEN_FIELDS)] * 4
    assert result.statistics["token_ids"]["turns_without_ids"] == 4


def test_required_ids_stop_the_run_at_the_first_reply_without_them(run_here, server):
    entries = [{"prompt": "a [mock no_token_ids]"}, {"prompt": "b [mock no_token_ids]"}]
    result = run_here(entries, *ONE_SLOT, "--token_ids=required")
    assert result.code == 2, result.stdout + result.stderr
    assert len(server.chat_requests()) == 1
    assert "--token_ids=required, but" in result.stdout and "the reply had no prompt_token_ids" in result.stdout
    assert result.trajectories == [] and result.batch_lines == []


def test_export_rl_needs_token_ids(run_here, server):
    result = run_here([{"prompt": "x"}], *ONE_SLOT, "--export=rl")
    assert result.code == 2 and "--export=rl builds its rows from token ids" in result.stderr
    assert server.chat_requests() == []


def test_keep_best_and_passed_choose_the_same_lines_of_tokens_jsonl(run_here, server):
    solve = {"prompt": "answer [mock turns=1 alternate command=echo%2042%20>%20answer.txt]"}
    solve["verify"] = 'test "$(cat answer.txt)" = 42'  # passes in even sessions only
    best = run_here([solve], *ONE_SLOT, "--n_samples=3", "--token_ids", "--keep=best")
    assert best.code == 0, best.stdout + best.stderr
    assert [t["metadata"]["sample_index"] for t in best.trajectories] == [0]
    assert [line["sample_index"] for line in best.jsonl("tokens.jsonl")] == [0]
    passed = run_here([solve], *ONE_SLOT, "--n_samples=3", "--resume", "--keep=passed")  # a merge again
    assert [t["metadata"]["sample_index"] for t in passed.trajectories] == [0, 2]
    assert [line["sample_index"] for line in passed.jsonl("tokens.jsonl")] == [0, 2]
    every = run_here([solve], *ONE_SLOT, "--n_samples=3", "--resume", "--keep=all")  # --keep is kept
    keys = [(line["prompt_index"], line["sample_index"]) for line in every.jsonl("tokens.jsonl")]
    assert keys == [(t["prompt_index"], t["metadata"]["sample_index"]) for t in every.trajectories] and len(keys) == 3


@pytest.mark.parametrize("stream", [False, True])
def test_a_llama_cpp_shaped_server_gives_completion_ids_from_its_logprobs(run_here, server, stream):
    """llama.cpp has no return_token_ids; its chat logprobs entries name each token's id (docs/tokens.md)."""
    flags = [*ONE_SLOT, "--token_ids", "--export=rl", *(["--stream"] if stream else [])]
    result = run_here([{"prompt": "notes [mock ids=llamacpp]"}], *flags)
    assert result.code == 0, result.stdout + result.stderr
    (line,) = result.jsonl("tokens.jsonl")
    assert [turn["prompt_token_ids"] for turn in line["turns"]] == [None] * 3
    assert all(len(turn["token_ids"]) == len(turn["logprobs"]) > 0 for turn in line["turns"])
    direct = agent(server, "notes [mock ids=llamacpp]", token_ids="on")  # the same first request, in-process
    assert direct.tokens[0]["token_ids"] == line["turns"][0]["token_ids"]
    assert "answered without token ids: the reply had no prompt_token_ids" in result.stderr
    assert result.jsonl("export/rl.jsonl") == []  # no prompt ids: nothing to build a row on
    assert result.statistics["token_ids"]["turns_without_ids"] == 3


@pytest.mark.parametrize("hostile", ["name_list", "calls_string", "args_number", "no_ids", "dup_ids"])
def test_hostile_calls_go_back_as_the_loop_reads_them(server, hostile):
    """Only well-formed calls are echoed as sent; the others as the loop read them, which the
    continuity check may then call drift (the server's reply was not one a template renders)."""
    result = agent(server, f"x [mock {hostile}]", token_ids="on")
    assert result.exit_reason == "completed" and len(result.tokens) == result.api_calls
    echoed = server.chat_requests()[1]["body"]["messages"][1]
    assert all(isinstance(call["function"]["name"], str) for call in echoed["tool_calls"])
    assert all(isinstance(call["function"]["arguments"], str) for call in echoed["tool_calls"])


def test_a_resume_keeps_token_ids_on_or_off(run_here, server):
    plain = run_here([{"prompt": "x [mock turns=0]"}], *ONE_SLOT)
    assert plain.code == 0
    refused = run_here([{"prompt": "x [mock turns=0]"}], *ONE_SLOT, "--resume", "--token_ids")
    assert refused.code == 2 and "--token_ids: this run" in refused.stderr
    ids = run_here([{"prompt": "y [mock turns=0]"}], *ONE_SLOT, "--token_ids", run_name="ids")
    stricter = run_here([{"prompt": "y [mock turns=0]"}], *ONE_SLOT, "--resume", "--token_ids=required", run_name="ids")
    assert (ids.code, stricter.code) == (0, 0) and len(stricter.jsonl("tokens.jsonl")) == 1
