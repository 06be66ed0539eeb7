"""An agent session -> one ShareGPT trajectory record; reasoning extraction; tool statistics.

The record's format is fixed in DESIGN.md: every row has the same keys with the same types, whatever
its run did, so HuggingFace `datasets` loads any set of trajectories.jsonl files together. Arrow types a
column by the values it sees first, and `datasets` casts every later file (and every 10 MB chunk of a
file) to that type: a value that is empty (`[]`), null, or keyed differently in some runs (a dataset
entry) would make a column list<null>, null or another struct there, and the load fail. Such values are
JSON text here, and no leaf is ever null: a value that may be unknown has a placeholder of its own type
and a flag that says whether it is known (`usage.cost_known`, `verification.verified`). docs/record.md
lists every field with its type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trajforge import safejson

EMPTY_THINK = "<think>\n\n</think>"


def text_encoder(sort_keys: bool = False) -> Callable[[Any], str]:
    """json.dumps(value, ensure_ascii=False, sort_keys=sort_keys), its C encoder made once: json.dumps and
    JSONEncoder.encode make one per call, which costs as much as encoding the record's small texts (the
    merge renders every record). The values are parsed JSON, never circular, so nothing checks for it."""
    encoder = json.JSONEncoder(ensure_ascii=False, sort_keys=sort_keys)
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]  # None where there is no C accelerator
    if make is None:
        return encoder.encode
    chunks = make(None, encoder.default, json.encoder.encode_basestring, None, ": ", ", ", sort_keys, False, True)
    return lambda value: "".join(chunks(value, 0))


# The record's JSON texts, json.dumps(..., ensure_ascii=False).
TEXT = text_encoder()
NO_CALLS = "[]"
_TAGGED = re.compile(r"<(think|REASONING_SCRATCHPAD)>(.*?)</\1>\s*", re.S)

SYSTEM_TEMPLATE = (
    "You are a function calling AI model. You are given function signatures within <tools></tools> "
    "XML tags. You may call one or more functions to help with the user's request; if none is relevant, "
    "answer in plain language. Do not guess values to pass to functions. Function results come back "
    "within <tool_response></tool_response> XML tags.\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a JSON object with the function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n'
    "</tool_call>"
)


NO_RESULT: Any = object()  # a call whose result a record of an older version does not hold


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # as the model sent it: a JSON string, possibly broken
    result: Any = field(default_factory=dict)  # the tool's JSON-able dict (NO_RESULT: an old record held none)

    @property
    def has_result(self) -> bool:
        return self.result is not NO_RESULT

    @property
    def ok(self) -> bool:
        return not (isinstance(self.result, dict) and self.result.get("error"))

    def arguments_json(self) -> str:
        """Arguments as a JSON text that always parses: the model's, or (when it sent something that is
        not JSON) that text as a JSON string, so nothing is lost."""
        try:
            safejson.parse(self.arguments)
        except (ValueError, TypeError):
            return safejson.dumps(self.arguments).decode()
        return self.arguments

    def result_text(self) -> str:
        """The result as exports write it: compact JSON text ("" when the record held none)."""
        if not self.has_result:
            return ""
        return self.result if isinstance(self.result, str) else safejson.dumps(self.result).decode()


@dataclass
class Turn:
    """One assistant reply and the results of its tool calls."""

    content: str
    reasoning: str
    calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = ""  # as the server said it (stop, tool_calls, length, content_filter); "" when none


def split_reasoning(message: dict) -> tuple[str, str]:
    """(reasoning, content) of an assistant message: the first native field that has it (`reasoning`,
    `reasoning_content`, `reasoning_details`), then <think> / <REASONING_SCRATCHPAD> in the content."""
    # Providers often send the same reasoning in several of these fields: take the first one given.
    listed = message.get("reasoning_details")
    items = [d for d in listed if isinstance(d, dict)] if isinstance(listed, list) else []
    details = [text for d in items if isinstance(text := d.get("text") or d.get("summary"), str)]
    native = (message.get("reasoning"), message.get("reasoning_content"), "\n".join(d for d in details if d))
    parts = [next((text for text in native if isinstance(text, str) and text.strip()), None)]
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    elif not isinstance(content, str):  # anything else a server may send there, kept as its JSON text
        content = TEXT(content)
    if "</think>" in content and "<think>" not in content:
        # Templates that open <think> in the prompt leave only the closing tag in the reply.
        head, _, content = content.partition("</think>")
        parts.append(head)
    parts.extend(match.group(2) for match in _TAGGED.finditer(content))
    content = _TAGGED.sub("", content)
    reasoning = "\n".join(p.strip() for p in parts if isinstance(p, str) and p.strip())
    return reasoning, content.strip()


def system_turn(functions: list[dict]) -> str:
    """The system turn's text: the offered functions ({name, description, parameters}) listed."""
    return SYSTEM_TEMPLATE.format(tools=TEXT(functions))


def _arguments_value(raw: str):
    """The arguments as JSON, or as their text when they are not JSON the record can hold."""
    try:
        return safejson.parse(raw or "{}")
    except ValueError:
        return raw


def turn_of(speaker: str, value: str, tool_calls: str = NO_CALLS, finish_reason: str = "") -> dict:
    """One turn of `conversations`; every turn has these four keys, strings all. `tool_calls` is the
    JSON text of [{"id", "name", "arguments"}] (arguments as the model sent them), "[]" without calls."""
    return {"from": speaker, "value": value, "tool_calls": tool_calls, "finish_reason": finish_reason}


def conversations(system: str, prompt: str, turns: list[Turn]) -> list[dict]:
    """The ShareGPT turns of a session: its system text (system_turn), the prompt, then per assistant
    turn its `gpt` turn and, when it called tools, one `tool` turn with every result.

    A call's three JSON texts are written around TEXT of the values they hold, its id and name encoded
    once for the three: the same text as TEXT of each whole dict (its keys are plain), for a fraction of
    the time (the merge renders each call of every sample)."""
    convo = [turn_of("system", system), turn_of("human", prompt)]
    for turn in turns:
        value = f"<think>\n{turn.reasoning}\n</think>\n{turn.content}"
        listed, responses = [], []
        for call in turn.calls:
            id_, name, sent = _string(call.id), _string(call.name), call.arguments
            # TEXT({"name": .., "arguments": parsed}): the call in the gpt turn's text
            body = f'{{"name": {name}, "arguments": {TEXT(_arguments_value(sent))}}}'
            value += f"\n<tool_call>\n{body}\n</tool_call>"
            # TEXT({"id": .., "name": .., "arguments": as sent}): its entry of `tool_calls`
            listed.append(f'{{"id": {id_}, "name": {name}, "arguments": {_string(sent)}}}')
            # TEXT({"tool_call_id": .., "name": .., "content": result}): its result in the tool turn
            result = f'{{"tool_call_id": {id_}, "name": {name}, "content": {TEXT(call.result)}}}'
            responses.append(f"<tool_response>\n{result}\n</tool_response>")
        convo.append(turn_of("gpt", value, f"[{', '.join(listed)}]" if listed else NO_CALLS, turn.finish_reason))
        if responses:
            convo.append(turn_of("tool", "\n".join(responses)))
    return convo


def _string(value: Any) -> str:
    """TEXT(value) of a call's id, name or arguments: a string, encoded directly (or, should a record
    hold something else there, whatever it holds)."""
    return json.encoder.encode_basestring(value) if isinstance(value, str) else TEXT(value)


def tool_stats(turns: list[Turn], tool_names: list[str]) -> tuple[dict, dict]:
    """(tool_stats, tool_error_counts) over every registered tool, zeros included."""
    stats = {name: {"count": 0, "success": 0, "failure": 0} for name in tool_names}
    for call in (c for turn in turns for c in turn.calls):
        if call.name in stats:
            entry = stats[call.name]
            entry["count"] += 1
            entry["success" if call.ok else "failure"] += 1
    return stats, {name: entry["failure"] for name, entry in stats.items()}


EXIT_CODE_TOOLS = ("terminal", "execute_code")  # tools whose result carries the exit code of what they ran


def nonzero_exits(turns: list[Turn]) -> dict[str, int]:
    """{tool: calls whose command or program exited non-zero}, for terminal and execute_code, tools
    left out when none did. The tool itself worked, so tool_stats counts these calls as successes."""
    counts: dict[str, int] = {}
    for call in (c for turn in turns for c in turn.calls):
        code = call.result.get("exit_code") if isinstance(call.result, dict) else None
        if call.name in EXIT_CODE_TOOLS and isinstance(code, int) and not isinstance(code, bool) and code:
            counts[call.name] = counts.get(call.name, 0) + 1
    return counts


def discard_reason(turns: list[Turn], offered: set[str]) -> str | None:
    """Why the merge drops this sample: a tool it was not offered, or no reasoning at all."""
    if any(call.name not in offered for turn in turns for call in turn.calls):
        return "hallucinated_tool"
    if not any(turn.reasoning for turn in turns):
        return "no_reasoning"
    return None


def record_usage(usage: dict) -> dict:
    """A prompt's usage as the record holds it: an unknown cost (None) is 0.0 with `cost_known: false`,
    never a null, whose type would depend on the rows around it."""
    cost = usage.get("cost")
    return {**usage, "cost": 0.0 if cost is None else float(cost), "cost_known": cost is not None}


def known_cost(usage: dict) -> float | None:
    """The cost of a record's usage; None when unknown (`cost_known: false`, or a null cost in records
    written before the flag existed)."""
    return usage.get("cost") if usage.get("cost_known", True) else None


def known_reward(verification: dict) -> float | None:
    """A sample's reward; None when nothing verified it (the record's 0.0 is a placeholder)."""
    return verification.get("reward") if verification_passed(verification) is not None else None


def with_verification(record: dict, verification: dict) -> dict:
    """The record with its verification (verification.result: unverified() or result()) and the reward it gave:
    0.0 when nothing verified the sample, `verification.verified` says which."""
    record["metadata"]["verification"] = verification
    record["metadata"]["reward"] = verification["reward"]
    return record


def verification_passed(verification: dict | None) -> bool | None:
    """Whether a record's verification passed; None when nothing verified the sample (also in records
    written before `verified` existed, whose unverified `passed` is null)."""
    verification = verification or {}
    if not verification.get("verified", verification.get("passed") is not None):
        return None
    return bool(verification.get("passed"))


# Usage fields added since the cost flag, at their zero values: a judge's share of the totals (model/usage.py).
ADDED_USAGE = {"judge_tokens": 0, "judge_cost": 0.0}


def current_usage(usage: dict) -> dict:
    """A record's usage in this version's shape, the same keys in the same order as a new row's (the fields
    added since it was written at their zero values): `usage` itself when it has them."""
    if "cost_known" in usage and ADDED_USAGE.keys() <= usage.keys():
        return usage
    older = {key: value for key, value in usage.items() if key != "cost_known" and key not in ADDED_USAGE}
    added = {key: usage.get(key, zero) for key, zero in ADDED_USAGE.items()}
    return record_usage(older | {"cost": known_cost(usage)} | added)


def current_verification(verification: dict) -> dict:
    """A record's verification with the fields added since it was written (replay_diverged: false)."""
    if not verification or "replay_diverged" in verification:
        return verification
    return verification | {"replay_diverged": False}


def upgrade(record: dict) -> bool:
    """Give a record of an older version (a null cost, null verification values, or none at all, fields
    added since) this version's shape, in place; whether it changed. A merge of an older run folder then
    writes rows that load together with new ones."""
    metadata = record["metadata"]
    usage, verification = metadata.get("usage") or {}, metadata.get("verification") or {}
    current = current_usage(usage)
    if current is usage and "verified" in verification and "replay_diverged" in verification:
        return False
    metadata["usage"] = current
    if "verified" in verification:
        with_verification(record, current_verification(verification))
    else:
        passed = verification_passed(verification)
        with_verification(
            record,
            {
                "verified": passed is not None,
                "passed": bool(passed),
                "reward": float(verification.get("reward") or 0.0),
                "output": verification.get("output") or "",
                "duration_seconds": float(verification.get("duration_seconds") or 0.0),
                "error": verification.get("error") or "",
                "replay_diverged": bool(verification.get("replay_diverged")),
            },
        )
    return True
