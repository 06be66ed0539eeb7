"""The core pipeline end to end: flags reach the request, the record format, filters, isolation.

Whole runs go through batch_runner's entry point in this process (`run_here`); only what a separate
process shows (its command line, its exit with no key in its environment) runs one (`run`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import API_KEY, ROOT, calls, run_cli, source, write_dataset

TOOLS = ["--distribution=terminal_only"]


def test_record_format_summary_and_huggingface_loading(run_here):
    entries = [
        {"prompt": "inspect the workspace", "id": "task-7"},
        {"prompt": "b [mock turns=0]"},
        {"prompt": "c [mock bad_json]", "cwd": "x"},
        {"prompt": "d [mock turns=4]"},
    ]
    result = run_here(entries, *TOOLS, batch_size=4)
    assert result.code == 0, result.stderr
    record = next(r for r in result.trajectories if r["prompt_index"] == 0)
    assert list(record) == [
        "prompt_index",
        "conversations",
        "metadata",
        "completed",
        "partial",
        "api_calls",
        "toolsets_used",
        "tool_stats",
        "tool_error_counts",
    ]
    assert record["prompt_index"] == 0
    assert (record["completed"], record["partial"], record["api_calls"]) == (True, False, 3)
    assert record["toolsets_used"] == ["file", "terminal"]
    system, human, *turns = record["conversations"]
    assert system["from"] == "system"
    offered = json.loads(re.search(r"<tools>\n(.*)\n</tools>", system["value"], re.S).group(1))
    assert {tool["name"] for tool in offered} == {"terminal", "read_file", "write_file", "patch", "search_files"}
    assert human == {"from": "human", "value": "inspect the workspace", "tool_calls": "[]", "finish_reason": ""}
    assert [t["from"] for t in turns] == ["gpt", "tool", "gpt", "tool", "gpt"]
    first = turns[0]
    assert first["value"].startswith("<think>\nTurn 1:")
    assert "\n</think>\n" in first["value"]
    assert first["value"].count("<tool_call>\n") == 2
    call = calls(first)[0]
    assert set(call) == {"id", "name", "arguments"}
    assert call["name"] == "terminal" and isinstance(call["arguments"], str)
    assert json.loads(call["arguments"])["command"].startswith("echo mock-model-was-here")
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", turns[1]["value"], re.S)
    results = [json.loads(r) for r in responses]
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls(first)]
    terminal = results[0]["content"]
    assert terminal["exit_code"] == 0 and terminal["error"] is None
    assert terminal["output"].startswith("mock-model-was-here\n/")  # real output of the real command
    assert calls(turns[-1]) == [] and all(set(t) == set(human) for t in turns)
    meta = record["metadata"]
    assert meta["batch_num"] == 0 and meta["model"] == "test-model" and meta["run_name"] == "run"
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", meta["timestamp"])
    assert meta["exit_reason"] == "completed" and meta["duration_seconds"] > 0
    assert set(meta["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "reasoning_tokens",
        "cached_tokens",
        "cost",
        "judge_tokens",
        "judge_cost",
        "cost_known",
    }
    assert meta["usage"]["total_tokens"] > 0 and meta["usage"]["cost"] > 0 and meta["usage"]["cost_known"] is True
    assert source(record) == {"prompt": "inspect the workspace", "id": "task-7"}
    assert set(record["tool_stats"]) == set(record["tool_error_counts"])
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}
    assert record["tool_stats"]["patch"] == {"count": 0, "success": 0, "failure": 0}
    assert record["tool_error_counts"]["terminal"] == 0

    # Not a terminal: plain progress lines and the summary.
    assert "4/4 prompts ended, 0 failed" in result.stderr
    for text in ("Tool usage", "terminal", "Reasoning coverage: 100.0%", "Tokens:", "trajectories.jsonl"):
        assert text in result.stdout

    # Rows of every shape (no tool call, a broken call, a cwd, more turns) load as one table.
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(result.run_dir / "trajectories.jsonl"), split="train")
    assert loaded.num_rows == 4
    assert set(loaded.column_names) >= {"conversations", "tool_stats", "metadata"}


def test_flags_reach_the_request(run_here, server, tmp_path):
    prefill = tmp_path / "prefill.json"
    prefill.write_text(json.dumps([{"role": "user", "content": "PREFILL-Q"}, {"role": "assistant", "content": "OK"}]))
    result = run_here(
        [{"prompt": "one"}],
        *TOOLS,
        "--providers_allowed=anthropic,openai",
        "--providers_ignored=together",
        "--providers_order=openai,anthropic",
        "--provider_sort=price",
        "--reasoning_effort=high",
        "--max_tokens=321",
        "--ephemeral_system_prompt=EPHEMERAL-SYS",
        f"--prefill_messages_file={prefill}",
    )
    assert result.code == 0, result.stderr
    bodies = [r["body"] for r in server.chat_requests()]
    assert len(bodies) == 3
    for body in bodies:
        assert body["model"] == "test-model"
        assert body["provider"] == {
            "only": ["anthropic", "openai"],
            "ignore": ["together"],
            "order": ["openai", "anthropic"],
            "sort": "price",
        }
        assert body["reasoning"] == {"effort": "high"}
        assert body["max_tokens"] == 321
        assert body["messages"][:3] == [
            {"role": "system", "content": "EPHEMERAL-SYS"},
            {"role": "user", "content": "PREFILL-Q"},
            {"role": "assistant", "content": "OK"},
        ]
        assert body["messages"][3] == {"role": "user", "content": "one"}
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == [
        "read_file",
        "write_file",
        "patch",
        "search_files",
        "terminal",
    ]
    # Neither the ephemeral prompt, the prefill nor the key reaches any output file.
    for path in result.run_dir.iterdir():  # the response cache (a database) included
        data = path.read_bytes()
        for secret in ("EPHEMERAL-SYS", "PREFILL-Q", API_KEY):
            assert secret.encode() not in data, f"{secret} leaked into {path.name}"


def test_commands_cannot_leak_the_key_into_trajectories(run):
    # A subprocess: what the command reads is the runner's own command line (bwrap would hide it).
    flags = (*TOOLS, "--environment=local", "--ephemeral_system_prompt=EPHEMERAL-SYSTEM-TEXT")
    result = run([{"prompt": "snoop [mock snoop]"}], *flags)
    assert result.code == 0, result.stderr
    output = result.trajectories[0]["conversations"][3]["value"]
    assert "batch_runner.py" in output and "--api_key=*" in output  # overwritten in place by the runner
    assert API_KEY not in output and "EPHEMERAL-SYSTEM-TEXT" not in output


def test_defaults_send_no_routing_and_reasoning_disabled(run_here, server):
    result = run_here([{"prompt": "plain [mock reasoning=none]"}], *TOOLS, "--reasoning_disabled")
    assert result.code == 0, result.stderr
    body = server.chat_requests()[0]["body"]
    assert "provider" not in body and "max_tokens" not in body
    assert body["reasoning"] == {"enabled": False}
    # --reasoning_disabled turns the no-reasoning filter off, or every sample would be dropped.
    assert len(result.trajectories) == 1


def test_max_turns_gives_partial(run_here):
    result = run_here([{"prompt": "keep going [mock turns=9]"}], *TOOLS, "--max_turns=2")
    assert result.code == 0, result.stderr
    (record,) = result.trajectories
    assert (record["completed"], record["partial"], record["api_calls"]) == (False, True, 2)
    assert record["metadata"]["exit_reason"] == "max_turns"
    assert result.statistics["partial"] == 1


def test_max_samples_and_prompt_index(run_here, server):
    entries = [{"prompt": f"p{i}"} for i in range(5)]
    result = run_here(["", *entries[:2], "   ", *entries[2:]], *TOOLS, "--max_samples=3")
    assert result.code == 0, result.stderr
    assert sorted(r["prompt_index"] for r in result.trajectories) == [0, 1, 2]
    assert {r["prompt"] for r in server.chat_requests()} == {"p0", "p1", "p2"}
    assert result.statistics["total_prompts"] == 3


def first_thought(record: dict) -> str:
    return record["conversations"][2]["value"].split("\n</think>")[0].removeprefix("<think>\n")


def test_reasoning_is_found_everywhere_and_kept_once(run_here):
    kinds = ["reasoning", "reasoning_content", "reasoning_details", "think", "scratchpad", "all"]
    result = run_here([{"prompt": f"why [mock reasoning={kind}]"} for kind in kinds], *TOOLS, batch_size=6)
    assert result.code == 0, result.stderr
    assert len(result.trajectories) == len(kinds)
    for record in result.trajectories:
        for turn in (t for t in record["conversations"] if t["from"] == "gpt"):
            assert re.match(r"<think>\n(Turn \d|I have what I need).*\n</think>\n", turn["value"], re.S)
            assert "<think>" not in turn["value"][7:] and "SCRATCHPAD" not in turn["value"]
    # Sent in every native field at once, it is kept once.
    everywhere = next(r for r in result.trajectories if "reasoning=all" in source(r)["prompt"])
    thought = first_thought(everywhere)
    assert thought.startswith("Turn 1:") and thought.count("Turn 1:") == 1 and "\n" not in thought
    assert result.statistics["reasoning_statistics"]["coverage"] == 1.0


def test_streaming_gives_the_same_record(run_here, server):
    entries = [
        {"prompt": "stream it [mock reasoning=reasoning_content]"},
        {"prompt": "everywhere [mock reasoning=all]"},
    ]
    result = run_here(entries, *TOOLS, "--stream")
    assert result.code == 0, result.stderr
    assert all(r["body"]["stream"] for r in server.chat_requests())
    by_prompt = {source(r)["prompt"]: r for r in result.trajectories}
    record = by_prompt[entries[0]["prompt"]]
    gpt = [t for t in record["conversations"] if t["from"] == "gpt"]
    assert gpt[0]["value"].startswith("<think>\nTurn 1:") and len(calls(gpt[0])) == 2
    assert json.loads(calls(gpt[0])[1]["arguments"])["path"] == "notes.txt"
    assert record["metadata"]["usage"]["total_tokens"] > 0
    thought = first_thought(by_prompt[entries[1]["prompt"]])
    assert thought.startswith("Turn 1:") and thought.count("Turn 1:") == 1 and "\n" not in thought


def test_filters_no_reasoning_and_hallucinated_tools(run_here):
    entries = [
        {"prompt": "fine"},
        {"prompt": "silent [mock reasoning=none]"},
        {"prompt": "dreamer [mock unknown_tool]"},
        {"prompt": "broken json [mock bad_json]"},
    ]
    result = run_here(entries, *TOOLS)
    assert result.code == 0, result.stderr
    assert sorted(source(r)["prompt"] for r in result.trajectories) == [
        "broken json [mock bad_json]",
        "fine",
    ]
    discarded = {source(r)["prompt"]: r["discarded"] for r in result.batch_lines if "discarded" in r}
    assert discarded == {
        "silent [mock reasoning=none]": "no_reasoning",
        "dreamer [mock unknown_tool]": "hallucinated_tool",
    }
    stats = result.statistics
    assert (stats["discarded_no_reasoning"], stats["discarded_hallucinated_tools"], stats["trajectories"]) == (1, 1, 2)
    assert all("discarded" not in r for r in result.trajectories)
    # The unknown tool and the broken JSON came back to the model as errors, and the loop went on.
    dreamer = next(r for r in result.batch_lines if "dreamer" in source(r)["prompt"])
    assert "unknown tool 'hallucinated_tool'" in dreamer["conversations"][3]["value"]
    assert dreamer["completed"]
    broken = next(r for r in result.trajectories if "broken" in source(r)["prompt"])
    assert "not valid JSON" in broken["conversations"][3]["value"]
    assert broken["tool_stats"]["terminal"]["failure"] == 1 and broken["tool_error_counts"]["terminal"] == 1
    assert calls(broken["conversations"][2])[0]["arguments"] == '{"command": "echo broken'


def test_require_reasoning_false_keeps_them(run_here):
    result = run_here([{"prompt": "silent [mock reasoning=none]"}], *TOOLS, "--require_reasoning=False")
    assert result.code == 0, result.stderr
    (record,) = result.trajectories
    assert record["conversations"][2]["value"].startswith("<think>\n\n</think>\n")
    assert result.statistics["reasoning_statistics"]["coverage"] == 0.0


def test_prompts_are_isolated(run_here):
    entries = [{"prompt": "first"}, {"prompt": "second"}, {"prompt": "third", "cwd": "sub/dir"}]
    result = run_here(entries, *TOOLS, "--num_workers=1", "--concurrency=3", batch_size=3)
    assert result.code == 0, result.stderr
    outputs = {}
    for record in result.trajectories:
        response = re.search(r"<tool_response>\n(.*?)\n</tool_response>", record["conversations"][3]["value"], re.S)
        outputs[source(record)["prompt"]] = json.loads(response.group(1))["content"]["output"]
    cwds = {prompt: output.splitlines()[1] for prompt, output in outputs.items()}
    assert len(set(cwds.values())) == 3
    assert cwds["third"].endswith("/sub/dir")
    for output in outputs.values():  # nobody sees another prompt's notes.txt
        assert output.splitlines()[2:] == [".", ".."]


def test_bad_dataset_lines_exit_2_without_requests(run_here, server):
    # Each kind of bad line and its message: tests/test_dataset.py.
    lines = ['{"prompt": "ok"}', "not json", "[1, 2]", '{"prompt": ""}', '{"text": "x"}', '{"prompt": "x", "cwd": 5}']
    result = run_here(lines, *TOOLS)
    assert result.code == 2
    assert "5 bad line(s)" in result.stderr and "line 2: not valid JSON" in result.stderr
    assert server.requests == []
    assert not result.run_dir.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--distribution=nope"], "choose one of: default, image_gen"),
        (["--batch_size=0"], "--batch_size must be at least 1"),
        (["--provider_sort=cheap"], "--provider_sort must be one of price, throughput, latency"),
        (["--reasoning_effort=max"], "--reasoning_effort must be one of"),
        (["--reasoning_effort=low", "--reasoning_disabled"], "contradict"),
        (["--prefill_messages_file=missing.json"], "--prefill_messages_file: missing.json does not exist"),
        (["--num_workers=many"], "--num_workers must be a whole number"),
    ],
)
def test_bad_flags_exit_2(run_here, server, flags, message):
    result = run_here([{"prompt": "x"}], *flags)
    assert result.code == 2 and message in result.stderr, result.stderr
    assert server.requests == []


def test_missing_required_flag_and_key(tmp_path):
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": "x"}])
    flags = [f"--dataset_file={dataset}", "--run_name=r"]
    code, _, stderr = run_cli(flags)
    assert code == 2 and "--batch_size is required" in stderr
    # A process of its own: its exit status, with an environment that holds no key at all.
    command = [sys.executable, str(ROOT / "batch_runner.py"), *flags, "--batch_size=1"]
    proc = subprocess.run(command, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert proc.returncode == 2 and "OPENROUTER_API_KEY" in proc.stderr


def test_seed_makes_toolsets_reproducible(run_here):
    # The draw itself: tests/test_toolset_distributions.py; here, that scheduling does not change it.
    entries = [{"prompt": f"task {i} [mock turns=0]"} for i in range(12)]
    first = run_here(entries, "--distribution=development", "--seed=7", run_name="a")
    second = run_here(entries, "--distribution=development", "--seed=7", "--num_workers=1", run_name="b")
    assert first.code == second.code == 0, first.stderr + second.stderr

    def draws(result):
        return {r["prompt_index"]: r["toolsets_used"] for r in result.trajectories}

    assert draws(first) == draws(second)
    assert len({tuple(v) for v in draws(first).values()}) > 1  # 80% coin flips do differ between prompts


def test_verbose_logs_previews(run_here):
    result = run_here([{"prompt": "talk"}], *TOOLS, "--verbose", "--log_prefix_chars=12")
    assert result.code == 0, result.stderr
    assert "[prompt 0] turn 1 (tool calls: terminal, write_file): Turn 1: to m…" in result.stderr
    assert 'terminal result: {"output"' in result.stderr
