"""Many samples per prompt, verified: whole runs against the scripted server, with verify commands that
inspect files the agent wrote in real environments (local, bwrap, docker), Python verifiers, --keep,
preference pairs, --stop_after_passes, kill -9 and --resume with more samples.

The scripted model's `alternate` directive solves a task in every other session of a prompt (0, 2, ...),
which gives exact pass counts: with one worker and one slot, sample i is session i."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter

import pytest
from conftest import released, settled, source, wait_for
from test_environments import _available

from trajforge.verification.result import KEYS, unverified

ALPHA = "batch-runner-test/alpha:1"  # built by .ci/docker-up
SOLVE = "[mock turns=1 alternate command=echo%2042%20>%20answer.txt]"  # writes the answer in even sessions
CHECK = 'test "$(cat answer.txt)" = 42'
ONE_SLOT = ["--distribution=terminal_only", "--environment=local", "--num_workers=1", "--concurrency=1"]


def asked(server) -> Counter:
    """How many chat requests each prompt caused."""
    return Counter(r["prompt"] for r in server.chat_requests())


def samples(records) -> Counter:
    return Counter((source(r)["prompt"], r["metadata"]["sample_index"]) for r in records)


def commands(record) -> list[str]:
    return [
        json.loads(c["arguments"])["command"]
        for t in record["conversations"]
        for c in t.get("tool_calls", [])
        if c["name"] == "terminal"
    ]


def test_alternating_samples_exact_passes_keep_and_one_preference_pair(run_here, server):
    solve, plain = {"prompt": f"answer {SOLVE}", "verify": CHECK}, {"prompt": "no check [mock turns=1]"}
    first = run_here([solve, plain], *ONE_SLOT, "--n_samples=4", batch_size=3)
    assert first.code == 0, first.stdout + first.stderr
    assert samples(first.batch_lines) == Counter({(p["prompt"], i): 1 for p in (solve, plain) for i in range(4)})
    assert len(first.trajectories) == 8  # --keep=all
    by_sample = {r["metadata"]["sample_index"]: r for r in first.trajectories if source(r) == solve}
    assert [by_sample[i]["metadata"]["verification"]["passed"] for i in range(4)] == [True, False, True, False]
    assert [by_sample[i]["metadata"]["reward"] for i in range(4)] == [1.0, 0.0, 1.0, 0.0]
    for record in first.trajectories:
        # The verify command is in no conversation and no tool count: one terminal call per sample.
        assert CHECK not in json.dumps(record["conversations"]) and record["tool_stats"]["terminal"]["count"] == 1
        assert set(record["metadata"]["verification"]) == set(KEYS)
        assert record["metadata"]["verification"]["verified"] is (source(record) == solve)
        if source(record) == plain:
            assert record["metadata"]["verification"] == unverified() and record["metadata"]["reward"] == 0.0
    stats = first.statistics
    assert stats["verification"] == {
        "verified_samples": 4,
        "passed": 2,
        "failed": 2,
        "errors": 0,
        "mean_reward": 0.5,
        "pass_at_1": 0.5,
        "pass_at_k": 1.0,
        "entries_all_passed": 0,
        "entries_none_passed": 0,
        "preference_pairs": 1,
        "skipped_after_pass": 0,
    }
    assert "Verification: 2/4 samples passed (50%" in first.stdout and "passed 2/4 (50%)" in first.stderr
    datasets = pytest.importorskip("datasets")  # verified and unverified rows load together
    loaded = datasets.load_dataset("json", data_files=str(first.run_dir / "trajectories.jsonl"), split="train")
    assert loaded.num_rows == 8 and sorted(loaded["metadata"], key=lambda m: str(m["reward"]))[0]["reward"] == 0.0

    (pair,) = first.jsonl("preferences.jsonl")
    assert pair["prompt"] == [{"role": "user", "content": solve["prompt"]}]
    assert (pair["prompt_index"], pair["chosen_reward"], pair["rejected_reward"]) == (0, 1.0, 0.0)
    chosen_call = pair["chosen"][0]["tool_calls"][0]
    assert chosen_call["type"] == "function" and chosen_call["function"]["arguments"] == {
        "command": "echo 42 > answer.txt"
    }
    assert pair["rejected"][0]["tool_calls"][0]["function"]["arguments"]["command"].startswith("echo not")
    tool_message = pair["chosen"][1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == chosen_call["id"]
    assert [m["role"] for m in pair["chosen"]] == ["assistant", "tool", "tool", "assistant"]
    assert {t["function"]["name"] for t in pair["tools"]} == {
        "terminal",
        "read_file",
        "write_file",
        "patch",
        "search_files",
    }
    loaded = datasets.load_dataset("json", data_files=str(first.run_dir / "preferences.jsonl"), split="train")
    assert loaded.column_names[:3] == ["prompt", "chosen", "rejected"]

    calls = len(server.requests)
    passed = run_here([solve, plain], *ONE_SLOT, "--n_samples=4", "--resume", "--keep=passed")
    assert passed.code == 0 and samples(passed.trajectories) == Counter(
        {(solve["prompt"], 0): 1, (solve["prompt"], 2): 1}
    )
    best = run_here([solve, plain], *ONE_SLOT, "--n_samples=4", "--resume", "--keep=best")
    assert best.code == 0 and samples(best.trajectories) == Counter({(solve["prompt"], 0): 1})  # ties: lower index
    assert best.statistics["trajectories"] == 1 and len(best.batch_lines) == 8  # rejected samples stay
    assert len(best.jsonl("preferences.jsonl")) == 1
    assert len(server.requests) == calls  # re-merged without a single model call


@pytest.fixture(params=["local", "bwrap", "docker"])
def kind(request) -> str:
    return _available(request)


def test_verify_commands_inspect_the_agents_files_in_every_environment(run_here, kind):
    entry = {
        "prompt": f"in {kind} {SOLVE}",
        # Not the bare answer: a last line 42 would be a reward of 42, outside --reward_range.
        "verify": {"command": f"sed 's/^/answer: /' answer.txt; {CHECK}", "tools_called": ["terminal"]},
    }
    flags = [f"--environment={kind}", f"--default_image={ALPHA}", "--distribution=terminal_only", "--num_workers=1"]
    result = run_here([entry], *flags, "--n_samples=2")
    assert result.code == 0, result.stdout + result.stderr
    verdicts = {r["metadata"]["sample_index"]: r["metadata"]["verification"] for r in result.trajectories}
    assert verdicts[0]["passed"] is True and verdicts[0]["output"] == "answer: 42\n"
    assert verdicts[1]["passed"] is False and "No such file" in verdicts[1]["output"]  # never written
    assert result.statistics["verification"]["pass_at_1"] == 0.5


VERIFIER = """
import time

def check(record, env):
    answer = env.read_file("answer.txt").strip() if env.exec("test -f answer.txt").exit_code == 0 else ""
    return {"reward": float(answer == "42"), "info": {"answer": answer, "sample": record["metadata"]["sample_index"]}}

def hangs(record, env):
    time.sleep(3600)

def raises(record, env):
    raise KeyError("no grader for this task")
"""


def test_python_verifiers_in_a_whole_run(run_here, tmp_path, server):
    (tmp_path / "grader.py").write_text(VERIFIER)
    entry = {"prompt": f"graded {SOLVE}", "verify": "false"}  # --verifier wins over the field
    graded = run_here([entry], *ONE_SLOT, "--n_samples=2", "--verifier=grader.py:check", run_name="graded")
    assert graded.code == 0, graded.stdout + graded.stderr
    infos = sorted(json.loads(r["metadata"]["verification"]["output"])["answer"] for r in graded.trajectories)
    assert infos == ["", "42"] and graded.statistics["verification"]["passed"] == 1

    for name, error in (("hangs", "verifier timed out after 1s"), ("raises", "verifier raised KeyError")):
        flags = (*ONE_SLOT, f"--verifier=grader.py:{name}", "--verify_timeout=1")
        broken = run_here([{"prompt": f"{name} [mock turns=1]"}], *flags, run_name=name)
        assert broken.code == 0, broken.stdout  # the sample is saved, never failed
        (record,) = broken.trajectories
        assert (
            record["metadata"]["verification"]["passed"] is False
            and error in record["metadata"]["verification"]["error"]
        )
        assert broken.statistics["verification"]["errors"] == 1 and broken.statistics["failed"] == 0


def test_stop_after_passes_saves_the_remaining_samples(run_here, server):
    solve = {"prompt": f"stop early {SOLVE}", "verify": CHECK}
    first = run_here([solve], *ONE_SLOT, "--n_samples=6", "--stop_after_passes=2")
    assert first.code == 0, first.stdout + first.stderr
    # Sessions 0 (passes), 1 (fails), 2 (passes): then 3, 4 and 5 are never started.
    assert asked(server)[solve["prompt"]] == 3 * 2  # two requests per session
    assert sorted(r["metadata"]["sample_index"] for r in first.batch_lines) == [0, 1, 2]
    assert first.statistics["verification"]["skipped_after_pass"] == 3 and first.statistics["remaining"] == 0
    again = run_here([solve], *ONE_SLOT, "--n_samples=6", "--stop_after_passes=2", "--resume")
    assert again.code == 0 and "1 prompts already done" in again.stdout
    assert asked(server)[solve["prompt"]] == 6 and again.statistics["verification"]["skipped_after_pass"] == 3


def test_raising_n_samples_on_resume_runs_only_the_new_indices(run_here, server):
    entries = [{"prompt": "more samples [mock turns=1]"}, {"prompt": "of both [mock turns=1]"}]
    first = run_here(entries, *ONE_SLOT, "--n_samples=2")
    assert first.code == 0 and len(first.trajectories) == 4
    before = asked(server)
    more = run_here(entries, *ONE_SLOT, "--n_samples=4", "--resume")
    assert more.code == 0, more.stdout
    assert "0 prompts already done, 4 samples of 2 prompts to run" in more.stdout
    assert asked(server) - before == Counter({e["prompt"]: 2 * 2 for e in entries})  # samples 2 and 3, 2 calls each
    assert samples(more.trajectories) == Counter({(e["prompt"], i): 1 for e in entries for i in range(4)})


def test_a_sample_is_offered_the_same_tools_whatever_the_scheduling(run_here):
    entries = [{"prompt": f"draw {i} [mock turns=1]"} for i in range(3)]
    common = ["--distribution=development", "--environment=local", "--seed=11", "--n_samples=3"]
    one = run_here(entries, *common, "--num_workers=1", run_name="one")
    many = run_here(entries[::-1], *common, "--num_workers=2", "--concurrency=3", run_name="many")
    assert one.code == many.code == 0

    def draws(result) -> dict:
        return {(source(r)["prompt"], r["metadata"]["sample_index"]): r["toolsets_used"] for r in result.trajectories}

    assert draws(one) == draws(many) and len(draws(one)) == 9
    assert len({tuple(d) for d in draws(one).values()}) > 1  # samples get their own draws


def _lines(path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in path.glob("batch_*.jsonl")) if path.exists() else 0


@pytest.mark.parametrize("kill_after_lines", [1, 7])
def test_kill_9_in_a_multi_sample_run_then_resume_gives_each_sample_once(run, run_here, server, kill_after_lines):
    server.latency = 0.05
    entries = [{"prompt": f"task {i % 4}"} for i in range(5)]  # "task 0" twice
    flags = [
        "--distribution=terminal_only",
        "--environment=local",
        "--n_samples=3",
        "--num_workers=2",
        "--concurrency=2",
    ]
    folder = run.tmp_path / "out" / "run"
    proc = subprocess.Popen(
        run.command(entries, *flags, batch_size=4),
        cwd=run.tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for(lambda: _lines(folder) >= kill_after_lines, what=f"{kill_after_lines} lines")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: released(run), what="the killed workers to be gone")
    wait_for(lambda: settled(server), what="the requests in flight at the kill")
    result = run_here(entries, *flags, "--resume", batch_size=4)
    assert result.code == 0, result.stdout + result.stderr
    expected = Counter({(f"task {i}", s): 2 if i == 0 else 1 for i in range(4) for s in range(3)})
    assert samples(result.batch_lines) == expected and samples(result.trajectories) == expected
    assert result.statistics["trajectories"] == 15 and result.statistics["remaining"] == 0


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--n_samples=0", "--n_samples must be at least 1"),
        ("--keep=some", "--keep must be one of all, passed, best"),
        ("--pass_threshold=high", "--pass_threshold must be a number"),
        ("--verify_timeout=0", "--verify_timeout must be more than 0 and at most"),
        ("--stop_after_passes=0", "--stop_after_passes must be at least 1"),
        ("--verifier=missing.py:check", "missing.py does not exist or is not a file"),
        ("--verifier", "--verifier needs path/to/file.py:function"),
    ],
)
def test_bad_sample_flags_stop_before_any_request(run_here, server, flag, message):
    result = run_here([{"prompt": "p"}], flag)
    assert result.code == 2 and message in result.stderr
    assert not server.requests
