"""Preference pairs (preferences.jsonl) and the choice of samples behind them and behind --keep=best.

A pair is written in the conversational preference format TRL's DPO trainer reads: `prompt` (the user
turn), `chosen` and `rejected` (the assistant and tool messages of each sample), shaped exactly as
export/openai.jsonl shapes its messages (calls' arguments as objects, reasoning in `reasoning_content`,
tool messages with `tool_call_id`), and `tools`, the offered OpenAI tool objects as a list: the union of
both samples' offers, since each sample had its own toolset draw. The system turn of a trajectory only
lists the tools, which a chat template lists from `tools`, so the prompt holds the user turn alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajforge.export.openai import assistant_and_tool_messages
from trajforge.journal.rescored import Where
from trajforge.journal.sample import Sample


@dataclass(frozen=True)
class Candidate:
    """A verified sample that passed the merge's filters, as far as choosing among samples needs it."""

    position: Where  # its line: (batch file, line number)
    passed: bool
    reward: float
    api_calls: int
    sample_index: int


def best(candidates: list[Candidate]) -> Candidate | None:
    """The passing sample with the highest reward; ties: fewer model calls, then the lower sample index."""
    passing = [c for c in candidates if c.passed]
    return min(passing, key=lambda c: (-c.reward, c.api_calls, c.sample_index), default=None)


def pair(candidates: list[Candidate]) -> tuple[Candidate, Candidate] | None:
    """(chosen, rejected): the best passing sample and the failing one with the lowest reward (ties: the
    lower sample index); None unless the entry has both."""
    chosen = best(candidates)
    failing = [c for c in candidates if not c.passed]
    if chosen is None or not failing:
        return None
    return chosen, min(failing, key=lambda c: (c.reward, c.sample_index))


def preference_line(chosen: Sample, rejected: Sample) -> dict:
    functions = {tool["name"]: tool for tool in [*rejected.tools, *chosen.tools]}
    return {
        "prompt": [{"role": "user", "content": chosen.prompt}],
        "chosen": assistant_and_tool_messages(chosen),
        "rejected": assistant_and_tool_messages(rejected),
        "tools": [{"type": "function", "function": functions[name]} for name in sorted(functions)],
        "prompt_index": chosen.prompt_index,
        "chosen_reward": chosen.reward,
        "rejected_reward": rejected.reward,
    }
