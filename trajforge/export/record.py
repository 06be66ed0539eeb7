"""A trajectory record read back into its parts: system text, offered tools, prompt, and one Step per
assistant turn with its tool calls and their results matched by id.

Every exporter and the report read records through here, so the ShareGPT turn format (DESIGN.md) is
parsed in one place. It tolerates the shapes records have had and will have: `tool_calls` missing or an
empty list on turns without calls, a `finish_reason` or not, optional metadata keys absent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from trajforge import safejson

TOOLS_BLOCK = re.compile(r"<tools>\n(.*)\n</tools>", re.S)
# One result per line: its JSON (json.dumps) never holds a raw newline, so `.` (no DOTALL) is safe.
TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*)\n</tool_response>")
CALL_SEPARATOR = "\n<tool_call>\n"
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n"
NO_RESULT = object()


def dumps(value: Any) -> str:
    """JSON text (orjson: a tenth of json.dumps's time on tool results of some KB); what it cannot
    encode kept as escaped text (safejson.py), so every record can be exported."""
    return safejson.dumps(value).decode()


def loads(text: str) -> Any:
    """The JSON value of `text`; raises ValueError when it is not JSON or nested deeper than the run's
    limit (safejson.py): exporters keep such a text as text."""
    return safejson.parse(text)


@dataclass
class Call:
    id: str
    name: str
    arguments: str  # as recorded: a JSON string, possibly broken
    result: Any = NO_RESULT  # the tool's `content`, or NO_RESULT when the record holds none

    @property
    def has_result(self) -> bool:
        return self.result is not NO_RESULT

    @property
    def ok(self) -> bool:
        return not (isinstance(self.result, dict) and self.result.get("error"))

    def arguments_json(self) -> str:
        """Arguments as a JSON text that always parses: the recorded one, or (when the model sent
        something that is not JSON) that text as a JSON string, so nothing is lost."""
        try:
            loads(self.arguments)
        except (ValueError, TypeError):
            return dumps(self.arguments)
        return self.arguments

    def arguments_value(self) -> Any:
        return loads(self.arguments_json())

    def result_text(self) -> str:
        if not self.has_result:
            return ""
        return self.result if isinstance(self.result, str) else dumps(self.result)


@dataclass
class Step:
    """One assistant turn."""

    content: str
    reasoning: str
    calls: list[Call] = field(default_factory=list)
    finish_reason: str = ""


@dataclass
class Conversation:
    system: str
    prompt: str
    tools: tuple[dict, ...]  # function schemas as offered: {name, description, parameters}
    steps: list[Step]


def split_assistant(value: str, calls: int) -> tuple[str, str]:
    """(reasoning, content) of a gpt turn's value: `<think>\\n{reasoning}\\n</think>\\n{content}` followed
    by one `\\n<tool_call>\\n{json}\\n</tool_call>` per call. A call's JSON holds no raw newline, so the
    last `calls` separators are the calls' own whatever the content says."""
    head = value
    for _ in range(calls):
        before, found, _ = head.rpartition(CALL_SEPARATOR)
        if not found:
            break
        head = before
    if not head.startswith(THINK_OPEN):
        return "", head.strip()
    reasoning, found, content = head[len(THINK_OPEN) - 1 :].partition(THINK_CLOSE)
    if not found:
        return "", head.strip()
    return reasoning.strip(), content.strip()


def _tool_results(value: str) -> list[dict]:
    results = []
    for match in TOOL_RESPONSE.finditer(value):
        try:
            parsed = loads(match.group(1))
        except ValueError:
            continue
        if isinstance(parsed, dict):
            results.append(parsed)
    return results


def _attach(calls: list[Call], results: list[dict]) -> None:
    """Results to their calls by id; a result whose id names no call goes to the first call left
    without one, in order (records written before ids were kept)."""
    by_id: dict[object, Call] = {call.id: call for call in calls}  # an old record's ids may be None
    unmatched = []
    for result in results:
        call = by_id.get(result.get("tool_call_id"))
        if call is not None and not call.has_result:
            call.result = result.get("content")
        else:
            unmatched.append(result)
    waiting = (call for call in calls if not call.has_result)
    for result, call in zip(unmatched, waiting, strict=False):
        call.result = result.get("content")


@lru_cache(maxsize=64)
def offered_tools(system: str) -> tuple[dict, ...]:
    """The function schemas the system turn lists (cached: most prompts of a run are offered the same
    tools; callers must not change them)."""
    match = TOOLS_BLOCK.search(system)
    if not match:
        return ()
    try:
        tools = loads(match.group(1))
    except ValueError:
        return ()
    return tuple(tool for tool in tools if isinstance(tool, dict)) if isinstance(tools, list) else ()


def listed_calls(turn: dict) -> list[dict]:
    """A turn's structured calls: JSON text in this version's records (so every turn has the same
    type), a list in earlier ones, absent in the oldest."""
    listed = turn.get("tool_calls") or []
    if isinstance(listed, str):
        try:
            listed = loads(listed)
        except ValueError:
            listed = []
    return [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []


def _calls(turn: dict) -> list[Call]:
    calls = []
    for entry in listed_calls(turn):
        arguments = entry.get("arguments")
        if not isinstance(arguments, str):
            arguments = dumps(arguments if arguments is not None else {})
        calls.append(Call(str(entry.get("id") or ""), str(entry.get("name") or ""), arguments))
    return calls


def parse(record: dict) -> Conversation:
    system = prompt = ""
    steps: list[Step] = []
    for turn in record.get("conversations") or []:
        kind, value = turn.get("from"), turn.get("value")
        value = value if isinstance(value, str) else ""
        if kind == "system":
            system = value
        elif kind == "human":
            prompt = value
        elif kind == "gpt":
            calls = _calls(turn)
            reasoning, content = split_assistant(value, len(calls))
            finish = turn.get("finish_reason")
            steps.append(Step(content, reasoning, calls, finish if isinstance(finish, str) else ""))
        elif kind == "tool" and steps:
            _attach(steps[-1].calls, _tool_results(value))
    return Conversation(system, prompt, offered_tools(system), steps)


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of a prompt, cut at `limit` characters."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"
