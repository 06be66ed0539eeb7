"""What a run says about its samples: finish reasons kept (a cut-off answer is partial), the model the
endpoint reports, the progress line and the summary counting the same things (never a nan), warnings
for a model without reasoning or without tool calls, commands that exited non-zero, and the modes of
the run folder's files.

Pure parts in-process (progress_line, Advice, nonzero_exits, stream assembly); runs through
batch_runner's entry point against the scripted server; the file modes in a subprocess with its own
umask."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from agent_run import agent
from conftest import Result, source

from trajectory import ToolCall, Turn, nonzero_exits
from trajforge.events import PromptDone
from trajforge.model.stream import assemble, finish_reason, reported
from trajforge.run.advice import WINDOW, Advice
from trajforge.run.progress import Tally, progress_line

TOOLS = ["--distribution=terminal_only"]

# -- finish reasons and the reported model, in-process ---------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("reason", ["length", "content_filter"])
def test_a_cut_off_final_answer_ends_the_session_with_its_reason(server, reason, stream):
    result = agent(server, f"cut [mock stop={reason} turns=1]", stream=stream)
    assert result.exit_reason == reason
    assert [turn.finish_reason for turn in result.turns] == ["tool_calls", reason]
    answer = result.turns[-1].content
    assert answer.startswith("Here is my answer to 'cut") and "The tools showed: " not in answer  # cut mid-way


@pytest.mark.parametrize("stream", [False, True])
def test_every_turn_keeps_its_finish_reason_and_the_reported_model(server, stream):
    result = agent(server, "named [mock model=qwen2.5-0.5b-instruct-q4_k_m.gguf turns=1]", stream=stream)
    assert result.exit_reason == "completed"
    assert [turn.finish_reason for turn in result.turns] == ["tool_calls", "stop"]
    assert result.model_reported == "qwen2.5-0.5b-instruct-q4_k_m.gguf"
    assert agent(server, "anonymous [mock no_model turns=0]", stream=stream).model_reported == ""


def test_finish_reason_and_reported_model_of_any_reply():
    assert finish_reason({"choices": [{"finish_reason": "length"}]}) == "length"
    for data in ({}, {"choices": []}, {"choices": [{"finish_reason": None}]}, {"choices": [{"finish_reason": 7}]}):
        assert finish_reason(data) == ""
    assert reported({"model": "m"}) == "m" and reported({"model": ["m"]}) == reported({}) == ""
    chunks = [{"model": "m1", "choices": [{"delta": {"content": "a"}}]}, {"choices": [{"delta": {}}]}]
    assert reported(assemble(chunks)) == "m1"  # a chunk without the field keeps the name an earlier one gave


def test_a_turn_made_without_a_finish_reason_has_an_empty_one():
    assert Turn("content", "").finish_reason == ""


# -- counting, in-process -------------------------------------------------------------------------------


def test_the_progress_line_never_shows_a_nan():
    line = progress_line(Tally(planned=4), 12.0)
    assert line == "0/4 prompts ended, 0 failed, 0 discarded, 0 retries, 0.0/s, ETA unknown"
    assert progress_line(Tally(planned=4), 0.0).endswith("ETA unknown")
    assert progress_line(Tally(planned=4, ended=2, failed=1, discarded=1, retries=3), 10.0) == (
        "2/4 prompts ended, 1 failed, 1 discarded, 3 retries, 0.2/s, ETA 10s"
    )


def done(outcome: str = "completed", offered: int = 3, called: int = 1) -> PromptDone:
    return PromptDone(0, 0, outcome, 0, None, tools_offered=offered, tool_calls=called)


def test_advice_waits_for_the_window_then_warns_once():
    advice = Advice(require_reasoning=True)
    for _ in range(WINDOW - 1):
        assert advice.sample(done("no_reasoning", called=0)) == []
    no_reasoning, no_tools = advice.sample(done("no_reasoning", called=0))
    assert no_reasoning.startswith(f"the first {WINDOW} samples came without any reasoning")
    assert "--require_reasoning=False" in no_reasoning and "--resume --require_reasoning=False" in no_reasoning
    assert no_tools.startswith(f"tools were offered to {WINDOW} of the first {WINDOW} samples and not one")
    assert "chat template" in no_tools
    assert advice.sample(done("no_reasoning", called=0)) == [] and advice.judge() == []


def test_advice_on_a_short_run_is_given_when_it_ends():
    advice = Advice(require_reasoning=True)
    assert advice.sample(done("no_reasoning")) == []
    (warning,) = advice.judge()
    assert warning.startswith("all 1 samples came without any reasoning")


@pytest.mark.parametrize(
    "samples",
    [
        [done("no_reasoning"), done("completed")],  # one had reasoning
        [done("max_turns"), done("length")],
        [done(offered=0, called=0)],  # no tools offered: nothing to call
        [],
    ],
)
def test_advice_stays_quiet_when_something_worked(samples):
    advice = Advice(require_reasoning=True)
    for sample in samples:
        advice.sample(sample)
    assert advice.judge() == []


def test_without_the_reasoning_filter_nothing_is_discarded_to_warn_about():
    advice = Advice(require_reasoning=False)
    advice.sample(done("no_reasoning"))
    assert advice.judge() == []


def test_nonzero_exits_count_commands_not_tool_failures():
    def call(name: str, result: dict) -> ToolCall:
        return ToolCall("id", name, "{}", result)

    turns = [
        Turn("", "", [call("terminal", {"output": "", "exit_code": 127, "error": None})]),
        Turn("", "", [call("terminal", {"output": "ok", "exit_code": 0, "error": None})]),
        Turn("", "", [call("execute_code", {"stdout": "", "stderr": "Traceback", "exit_code": 1})]),
        Turn("", "", [call("terminal", {"error": "bad arguments for terminal"})]),  # the tool failed: not counted
        Turn("", "", [call("read_file", {"exit_code": 2}), call("terminal", {"exit_code": True})]),
    ]
    assert nonzero_exits(turns) == {"terminal": 1, "execute_code": 1}
    assert nonzero_exits([]) == {}


# -- runs --------------------------------------------------------------------------------------------------


def test_a_cut_off_answer_is_saved_partial_with_its_exit_reason(run_here):
    entries = [{"prompt": "cut [mock stop=length turns=1]"}, {"prompt": "filtered [mock stop=content_filter turns=0]"}]
    result = run_here(entries, *TOOLS, "--stream")
    assert result.code == 0
    by_prompt = {source(r)["prompt"]: r for r in result.trajectories}
    for prompt, reason in (("cut", "length"), ("filtered", "content_filter")):
        record = next(r for p, r in by_prompt.items() if p.startswith(prompt))
        assert (record["metadata"]["exit_reason"], record["completed"], record["partial"]) == (reason, False, True)
    assert result.statistics["partial"] == 2 and result.statistics["completed"] == 0


def test_metadata_keeps_the_alias_and_the_model_the_endpoint_reports(run_here):
    entries = [{"prompt": "named [mock model=SmolLM2-135M-Instruct turns=0]"}, {"prompt": "x [mock no_model turns=0]"}]
    result = run_here(entries, *TOOLS, "--require_reasoning=False")
    models = {source(r)["prompt"][0]: r["metadata"] for r in result.trajectories}
    assert (models["n"]["model"], models["n"]["model_reported"]) == ("test-model", "SmolLM2-135M-Instruct")
    assert (models["x"]["model"], models["x"]["model_reported"]) == ("test-model", "")


def before_summary(result: Result, text: str) -> bool:
    """`text` was printed while the run went (on stderr, with the progress line), not in the summary."""
    return text in result.stderr.replace("\n", " ") and text not in result.stdout


def test_a_model_without_reasoning_or_tool_calls_is_said_at_once_with_the_flag(run_here):
    entries = [{"prompt": f"plain {i} [mock reasoning=none turns=0]"} for i in range(3)]
    result = run_here(entries, *TOOLS)
    assert result.code == 0 and result.trajectories == []
    assert before_summary(result, "warning: all 3 samples came without any reasoning and were discarded")
    assert before_summary(result, "--resume --require_reasoning=False merges them in without calling the model again")
    assert before_summary(result, "warning: tools were offered to 3 of all 3 samples and not one tool was called")
    assert "No trajectory was kept: 3 sample(s) had no reasoning" in result.stdout
    # The progress line and the summary count the same discards.
    assert "3/3 prompts ended, 0 failed, 3 discarded, 0 retries" in result.stderr
    assert "This invocation: 3 of 3 planned prompts ended (0 failed, 3 discarded, 0 retries)" in result.stdout
    assert "nan" not in result.stdout + result.stderr
    kept = run_here(entries, *TOOLS, "--resume", "--require_reasoning=False")
    assert kept.code == 0 and len(kept.trajectories) == 3 and "warning" not in kept.stderr


def test_without_the_reasoning_filter_the_progress_line_counts_no_discard(run_here, server):
    entries = [{"prompt": "plain [mock reasoning=none]"}, {"prompt": "retried [mock fail=500 times=1 retry_after=0]"}]
    result = run_here(entries, *TOOLS, "--require_reasoning=False")
    assert result.code == 0 and len(result.trajectories) == 2
    assert "2/2 prompts ended, 0 failed, 0 discarded, 1 retries" in result.stderr
    assert "This invocation: 2 of 2 planned prompts ended (0 failed, 0 discarded, 1 retries)" in result.stdout
    assert before_summary(result, "api_http_500: prompt 1, retrying: Error code: 500")
    assert "warning" not in result.stderr  # reasoning is not required; tools were called


def test_the_tool_table_shows_commands_that_exited_non_zero(run_here):
    entries = [{"prompt": "missing [mock command=no-such-command turns=3]"}]  # then write, read, one more command
    result = run_here(entries, *TOOLS)
    assert result.code == 0
    terminal = result.statistics["tool_statistics"]["terminal"]
    assert (terminal["count"], terminal["success"], terminal["failure"], terminal["nonzero_exits"]) == (2, 2, 0, 1)
    assert "│ terminal   │     2 │       2 │       0 │            1 │" in result.stdout
    assert "nonzero_exits" not in result.trajectories[0]  # the merge takes the mark off


def test_every_file_of_the_run_folder_has_the_mode_the_umask_gives(run):
    entries = [{"prompt": "ok"}, {"prompt": "refused [mock fail=400]"}]
    proc = subprocess.run(
        run.command(entries, *TOOLS, "--export=openai,llamafactory,parquet"),
        cwd=run.tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        umask=0o027,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr  # the 400 is not sent again: nothing left to retry
    run_dir = run.tmp_path / "out" / "run"
    made = {
        str(path.relative_to(run_dir)): stat.S_IMODE(os.stat(path).st_mode)
        for path in run_dir.rglob("*")
        if path.is_file() and path.name != ".lock"
    }
    expected = {"batch_0.jsonl", "trajectories.jsonl", "statistics.json", "checkpoint.json", "errors.jsonl", "run.json"}
    expected.add("attempts.jsonl")
    expected |= {"README.md", "report.html", "responses.sqlite"}
    expected |= {f"export/{name}" for name in ("openai.jsonl", "llamafactory.json")}
    expected |= {"export/dataset_info.json", "export/trajectories.parquet"}
    assert set(made) == expected
    assert made == dict.fromkeys(expected, 0o640)
