"""The merge in-process, on a run folder written by hand: filters, --require_reasoning, totals
(trajforge.runfolder.merge)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from trajforge.runfolder.folder import RunFolder, entry_key
from trajforge.runfolder.merge import merge
from trajforge.runfolder.preferences import Candidate, best, pair

TOOLS = ["read_file", "terminal", "write_file"]


def record(
    prompt: str,
    *,
    think: bool = True,
    exit_reason: str = "completed",
    discarded: str | None = None,
    nonzero_exits: dict | None = None,
    **calls,
):
    """A batch-file line: two assistant turns (with reasoning or an empty think block), the tool
    calls given as tool=(success, failure), and a usage of 10 + 5 tokens costing 0.1; `nonzero_exits`
    as the worker marks it for the merge."""
    thought = "<think>\nbecause\n</think>\n" if think else "<think>\n\n</think>\n"
    stats = {name: {"count": 0, "success": 0, "failure": 0} for name in TOOLS}
    for name, (success, failure) in calls.items():
        stats[name] = {"count": success + failure, "success": success, "failure": failure}
    line = {
        "prompt_index": 0,
        "conversations": [
            {"from": "system", "value": "<tools>\n[]\n</tools>"},
            {"from": "human", "value": prompt},
            {"from": "gpt", "value": thought + "calling"},
            {"from": "tool", "value": "<tool_response>\n{}\n</tool_response>"},
            {"from": "gpt", "value": thought + "done"},
        ],
        "metadata": {
            "exit_reason": exit_reason,
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.1},
            "source": {"prompt": prompt},
        },
        "completed": exit_reason == "completed",
        "partial": exit_reason == "max_turns",
        "tool_stats": stats,
    }
    if discarded:
        line["discarded"] = discarded
    if nonzero_exits:
        line["nonzero_exits"] = nonzero_exits
    return line


@pytest.fixture
def folder(tmp_path) -> RunFolder:
    """batch_0: kept, no reasoning, partial; batch_2: hallucinated tool, kept twice (a duplicate
    prompt), and a torn last line; an unrelated file beside them."""
    folder = RunFolder(tmp_path)
    batches = {
        0: [
            record("kept", terminal=(1, 0), nonzero_exits={"terminal": 1}),
            record("silent", think=False, discarded="no_reasoning", terminal=(0, 1)),
            record("partial", exit_reason="max_turns", read_file=(2, 0)),
        ],
        2: [
            record("dreamer", discarded="hallucinated_tool", browser_click=(0, 1)),
            record("twice", write_file=(1, 1)),
            record("twice"),
        ],
    }
    for num, lines in batches.items():
        folder.batch_file(num).write_text("".join(json.dumps(line) + "\n" for line in lines))
    with open(folder.batch_file(2), "a") as handle:
        handle.write('{"prompt_index": 9, "conversa')
    (tmp_path / "notes.jsonl").write_text(json.dumps(record("not a batch file")) + "\n")
    return folder


def merged(folder: RunFolder) -> list[str]:
    return [json.loads(line)["metadata"]["source"]["prompt"] for line in folder.trajectories.read_text().splitlines()]


def test_filters_and_totals(folder):
    warnings: list[str] = []
    totals = merge(folder, True, TOOLS, warnings.append)
    assert merged(folder) == ["kept", "partial", "twice", "twice"]  # batch order, line order
    assert (totals.trajectories, totals.completed, totals.partial) == (4, 3, 1)
    assert (totals.discarded_no_reasoning, totals.discarded_hallucinated_tools) == (1, 1)
    assert warnings == ["batch_2.jsonl line 4 is incomplete (cut off by a crash?); ignoring it"]
    # Every final outcome counts as finished, discarded ones included: --resume must not redo them.
    every = ["kept", "silent", "partial", "dreamer", "twice", "twice"]
    assert totals.finished == Counter((entry_key({"prompt": prompt}), 0) for prompt in every)
    # Tool statistics cover every line of the batch files, with rates; registered tools keep their zeros.
    stats = totals.tool_statistics
    assert list(stats)[:3] == TOOLS and set(stats) == {*TOOLS, "browser_click"}
    # A command that exited non-zero is a success of the tool, counted apart.
    assert stats["terminal"] == {
        "count": 2,
        "success": 1,
        "failure": 1,
        "success_rate": 0.5,
        "failure_rate": 0.5,
        "nonzero_exits": 1,
    }
    assert stats["write_file"]["success_rate"] == 0.5 and stats["read_file"]["success_rate"] == 1.0
    assert stats["browser_click"] == {
        "count": 1,
        "success": 0,
        "failure": 1,
        "success_rate": 0.0,
        "failure_rate": 1.0,
        "nonzero_exits": 0,
    }
    assert all("nonzero_exits" not in json.loads(line) for line in folder.trajectories.read_text().splitlines())
    assert totals.reasoning_statistics == {
        "total_assistant_turns": 12,
        "turns_with_reasoning": 10,
        "turns_without_reasoning": 2,
        "coverage": 0.8333,
    }
    # 6 * 0.1, rounded; the judge's share (none) as upgrade() gives these older records this version's shape
    assert totals.usage == {
        "prompt_tokens": 60,
        "completion_tokens": 30,
        "cost": 0.6,
        "judge_tokens": 0,
        "judge_cost": 0.0,
    }


def test_without_require_reasoning_the_silent_sample_is_kept_without_its_mark(folder):
    totals = merge(folder, False, TOOLS, lambda text: None)
    assert merged(folder) == ["kept", "silent", "partial", "twice", "twice"]
    assert totals.discarded_no_reasoning == 0 and totals.discarded_hallucinated_tools == 1
    lines = [json.loads(line) for line in folder.trajectories.read_text().splitlines()]
    assert all("discarded" not in line for line in lines)
    assert json.loads(folder.batch_file(0).read_text().splitlines()[1])["discarded"] == "no_reasoning"  # untouched


def test_a_folder_without_batch_files_merges_to_nothing(tmp_path):
    totals = merge(RunFolder(tmp_path), True, TOOLS, lambda text: None)
    assert (tmp_path / "trajectories.jsonl").read_text() == ""
    assert totals.trajectories == 0 and totals.usage == {} and totals.finished == Counter()
    assert totals.reasoning_statistics["coverage"] == 0.0
    assert totals.tool_statistics["terminal"] == {
        "count": 0,
        "success": 0,
        "failure": 0,
        "success_rate": 0.0,
        "failure_rate": 0.0,
        "nonzero_exits": 0,
    }


def test_the_best_sample_and_the_preference_pair_of_an_entry():
    def sample(index, passed, reward, calls=3):
        return Candidate(("batch_0.jsonl", 10 + index), passed, reward, api_calls=calls, sample_index=index)

    tied = [sample(0, True, 1.0, calls=4), sample(1, True, 1.0), sample(2, True, 1.0), sample(3, True, 0.9, calls=1)]
    assert best(tied).sample_index == 1  # highest reward, then fewer model calls, then the lower index
    assert best([sample(0, False, 2.0)]) is None  # a failing sample is never the best, whatever its reward
    mixed = [sample(0, False, 0.4), sample(1, True, 0.6), sample(2, False, 0.1), sample(3, False, 0.1)]
    chosen, rejected = pair(mixed)
    assert (chosen.sample_index, rejected.sample_index) == (1, 2)  # the lowest reward fails; ties: lower index
    assert pair(tied) is None and pair([sample(0, False, 0.0)]) is None


def test_keep_best_and_the_pairs_read_again_only_their_own_lines(tmp_path):
    """The second pass (--keep=best, preference pairs) parses only the lines the first chose, in batch
    order: a torn line among the others is warned of once, by the first pass."""
    folder = RunFolder(tmp_path)

    def verified(prompt: str, index: int, passed: bool) -> str:
        line = record(prompt)
        line["metadata"] |= {
            "sample_index": index,
            "verification": {"verified": True, "passed": passed, "reward": 1.0 * passed},
        }
        return json.dumps(line) + "\n"

    folder.batch_file(0).write_text(verified("solve", 0, False) + '{"torn\n' + verified("solve", 1, True))
    folder.batch_file(1).write_text(verified("other", 0, True))
    warnings: list[str] = []
    merge(folder, True, TOOLS, warnings.append, keep="best")
    assert merged(folder) == ["solve", "other"]
    pairs = [json.loads(line) for line in folder.preferences.read_text().splitlines()]
    assert [(p["prompt"][0]["content"], p["chosen_reward"], p["rejected_reward"]) for p in pairs] == [
        ("solve", 1.0, 0.0)
    ]
    assert warnings == ["batch_0.jsonl line 2 is incomplete (cut off by a crash?); ignoring it"]
