"""Preference pairs (preferences.jsonl) and the choice of samples behind them and behind --keep=best.

A pair is written in the conversational preference format TRL's DPO trainer reads: `prompt` (the user
turn), `chosen` and `rejected` (the assistant and tool messages of each sample) in the OpenAI chat format
(`tool_calls` with `function.arguments` as a JSON string, tool messages with `tool_call_id`), and `tools`,
the offered function schemas as a JSON string: the union of both samples' offers, since each sample had
its own toolset draw. The system turn of a trajectory only lists the tools, which `tools` carries, so
the prompt holds the user turn alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

TOOL_CALL = "\n<tool_call>\n"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>\n", "\n</tool_response>"


@dataclass(frozen=True)
class Candidate:
    """A verified sample that passed the merge's filters, as far as choosing among samples needs it."""

    position: int  # its place among the batch lines, in batch order
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


def _calls(turn: dict) -> list[dict]:
    calls = turn.get("tool_calls") or []
    return json.loads(calls) if isinstance(calls, str) else calls  # a JSON string in some record versions


def messages(record: dict) -> list[dict]:
    """The assistant and tool turns of a trajectory as OpenAI chat messages."""
    out = []
    for turn in record["conversations"]:
        if turn["from"] == "gpt":
            calls = _calls(turn)
            content = turn["value"]
            for _ in calls:  # the calls are written after the content, one block each: take them off
                content = content[: content.rfind(TOOL_CALL)]
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls
                ]
            out.append(message)
        elif turn["from"] == "tool":
            for block in turn["value"].split(RESPONSE_OPEN)[1:]:
                response = json.loads(block[: block.rfind(RESPONSE_CLOSE)])
                content = response.get("content")
                text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
                out.append({"role": "tool", "tool_call_id": response.get("tool_call_id"), "content": text})
    return out


def offered_tools(record: dict) -> list[dict]:
    """The function schemas of the system turn's <tools> block."""
    system = next((t["value"] for t in record["conversations"] if t["from"] == "system"), "")
    start, end = system.find("<tools>\n"), system.rfind("\n</tools>")
    return json.loads(system[start + len("<tools>\n") : end]) if start >= 0 and end > start else []


def preference_line(chosen: dict, rejected: dict) -> dict:
    prompt = next(t["value"] for t in chosen["conversations"] if t["from"] == "human")
    functions = {f["name"]: f for f in offered_tools(rejected) + offered_tools(chosen)}
    tools = [{"type": "function", "function": functions[name]} for name in sorted(functions)]
    return {
        "prompt": [{"role": "user", "content": prompt}],
        "chosen": messages(chosen),
        "rejected": messages(rejected),
        "tools": json.dumps(tools, ensure_ascii=False),
        "prompt_index": chosen["prompt_index"],
        "chosen_reward": chosen["metadata"]["reward"],
        "rejected_reward": rejected["metadata"]["reward"],
    }
