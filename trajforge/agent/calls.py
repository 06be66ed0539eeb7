"""The tool calls of a reply as the agent loop runs them, whatever the server sent.

A hostile or broken server may send a name that is not a string, arguments that are neither a JSON
string nor an object, `tool_calls` that is not a list, entries that are not objects, ids missing or
repeated, or thousands of calls. None of that may crash a prompt: each call becomes a ToolCall with a
string name (the JSON text of what came, when it was not a string) and an id of its own, and a call
that must not run carries the reason, which the model reads as its result."""

from __future__ import annotations

import json

from trajectory import ToolCall

NOT_AN_OBJECT = "a tool call must be an object with a function {{name, arguments}}, got {got}"


def read_tool_calls(message: dict, turn: int, limit: int) -> list[tuple[ToolCall, str | None]]:
    """(call, why it is not run, or None) for each tool call of `message`, the reply of model call
    `turn`; the first `limit` may run, the others are answered without running."""
    sent = message.get("tool_calls")
    if not sent:
        return []
    if not isinstance(sent, list):
        return [
            (ToolCall(f"call_{turn}_0", _text(sent), "{}"), f"tool_calls must be a list of calls, got {_kind(sent)}")
        ]
    taken = {entry["id"] for entry in sent if isinstance(entry, dict) and isinstance(entry.get("id"), str)}
    used: set[str] = set()
    calls = []
    for i, entry in enumerate(sent):
        call, problem = _read(entry)
        if not call.id or call.id in used:  # ours then: every result must answer exactly one call
            call.id = _fresh_id(turn, i, taken)
            taken.add(call.id)
        used.add(call.id)
        if problem is None and i >= limit:
            problem = (
                f"not run: this reply has {len(sent)} tool calls and at most {limit} run per reply "
                "(--max_tool_calls_per_turn); send the others in a later reply"
            )
        calls.append((call, problem))
    return calls


def _read(entry) -> tuple[ToolCall, str | None]:
    if not isinstance(entry, dict):
        return ToolCall("", _text(entry), "{}"), NOT_AN_OBJECT.format(got=_kind(entry))
    call_id = sent_id if isinstance(sent_id := entry.get("id"), str) else ""
    function = entry.get("function")
    if not isinstance(function, dict):
        problem = NOT_AN_OBJECT.format(got=f"a function that is {_kind(function)}")
        return ToolCall(call_id, _text(function), "{}"), problem
    name, arguments = function.get("name"), function.get("arguments")
    problems = []
    if not isinstance(name, str):
        problems.append(f"the name of a tool call must be a string, got {_kind(name)}")
        name = _text(name)
    if arguments is None:  # no arguments at all: as for a tool without parameters
        arguments = "{}"
    elif isinstance(arguments, dict):  # some servers send the object itself
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif not isinstance(arguments, str):
        problems.append(f"the arguments of a tool call must be a JSON object, got {_kind(arguments)}")
        arguments = _text(arguments)
    return ToolCall(call_id, name, arguments), "; ".join(problems) or None


def _fresh_id(turn: int, index: int, taken: set[str]) -> str:
    candidate, n = f"call_{turn}_{index}", 0
    while candidate in taken:
        n += 1
        candidate = f"call_{turn}_{index}_{n}"
    return candidate


def _text(value) -> str:
    """What came, as JSON text; nothing (None) as the empty string."""
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def _kind(value) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)
