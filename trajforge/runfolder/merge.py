"""Merge every batch file into trajectories.jsonl, applying the filters, and total up statistics.

A pure filter over batch files: a later run can merge again with other settings without calling the
model. It streams line by line, so memory stays flat however large the run folder is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from trajectory import EMPTY_THINK
from trajforge.runfolder.folder import RunFolder, entry_key, write_atomic
from trajforge.secrets import KINDS


@dataclass
class Totals:
    completed: int = 0
    partial: int = 0
    discarded_no_reasoning: int = 0
    discarded_hallucinated_tools: int = 0
    trajectories: int = 0
    tool_statistics: dict = field(default_factory=dict)
    reasoning_statistics: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)
    cost_known: bool = True  # every trajectory's cost is known (a null cost makes the total null)
    finished: Counter = field(default_factory=Counter)  # entry keys with a final outcome
    redactions: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))  # secrets masked, by kind


def _rates(stats: dict) -> dict:
    out = {}
    for name, entry in stats.items():
        count = entry["count"]
        out[name] = {
            **entry,
            "success_rate": round(entry["success"] / count, 4) if count else 0.0,
            "failure_rate": round(entry["failure"] / count, 4) if count else 0.0,
        }
    return out


def merge(folder: RunFolder, require_reasoning: bool, tool_names: list[str], warn: Callable[[str], None]) -> Totals:
    totals = Totals()
    tools = {name: {"count": 0, "success": 0, "failure": 0} for name in tool_names}
    turns = with_reasoning = 0
    usage: dict = {}

    def write(handle) -> None:
        nonlocal turns, with_reasoning
        for line, record in folder.batch_lines(warn):
            for turn in record["conversations"]:
                if turn["from"] == "gpt":
                    turns += 1
                    with_reasoning += not turn["value"].startswith(EMPTY_THINK)
            for name, entry in record["tool_stats"].items():
                known = tools.setdefault(name, {"count": 0, "success": 0, "failure": 0})
                for key in known:
                    known[key] += entry[key]
            for key, value in record["metadata"]["usage"].items():
                if key == "cost" and (value is None or usage.get(key, 0) is None):
                    totals.cost_known = False
                    usage[key] = None  # unknown: never a sum that leaves a prompt out
                else:
                    usage[key] = usage.get(key, 0) + value
            totals.finished[entry_key(record["metadata"]["source"])] += 1
            reason = record.pop("discarded", None)
            masked = record.pop("redactions", None)
            for kind, count in (masked or {}).items():
                totals.redactions[kind] = totals.redactions.get(kind, 0) + count
            if reason == "hallucinated_tool":
                totals.discarded_hallucinated_tools += 1
                continue
            if reason == "no_reasoning" and require_reasoning:
                totals.discarded_no_reasoning += 1
                continue
            handle.write(line if reason is None and masked is None else orjson.dumps(record) + b"\n")
            totals.trajectories += 1
            totals.completed += record["completed"]
            totals.partial += record["partial"]

    write_atomic(folder.trajectories, write)
    totals.tool_statistics = _rates(tools)
    totals.reasoning_statistics = {
        "total_assistant_turns": turns,
        "turns_with_reasoning": with_reasoning,
        "turns_without_reasoning": turns - with_reasoning,
        "coverage": round(with_reasoning / turns, 4) if turns else 0.0,
    }
    totals.usage = {key: round(value, 8) if isinstance(value, float) else value for key, value in usage.items()}
    return totals
