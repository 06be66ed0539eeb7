"""The reader of version-1 batch lines: the ShareGPT record itself (with the batch file's own keys),
as every main before the journal wrote them, read back into a Sample: the offered tools from the system
text, one Turn per assistant turn with its tool calls and their results matched by id.

It tolerates the shapes those records had: `tool_calls` missing or an empty list on turns without
calls, a `finish_reason` or not, optional metadata keys absent, a null cost or verification (upgraded).
The record's own text is what trajectories.jsonl gets for such a line, as before (Sample.legacy).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from trajectory import NO_RESULT, ToolCall, Turn, upgrade
from trajforge import safejson
from trajforge.journal.sample import OWN_KEYS, Sample

TOOLS_BLOCK = re.compile(r"<tools>\n(.*)\n</tools>", re.S)
# One result per line: its JSON (json.dumps) never holds a raw newline, so `.` (no DOTALL) is safe.
TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*)\n</tool_response>")
CALL_SEPARATOR = "\n<tool_call>\n"
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n"


def dumps(value: Any) -> str:
    """JSON text (orjson: a tenth of json.dumps's time on tool results of some KB); what it cannot
    encode kept as escaped text (safejson.py), so every record can be exported."""
    return safejson.dumps(value).decode()


def loads(text: str) -> Any:
    """The JSON value of `text`; raises ValueError when it is not JSON or nested deeper than the run's
    limit (safejson.py): exporters keep such a text as text."""
    return safejson.parse(text)


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


def _attach(calls: list[ToolCall], results: list[dict]) -> None:
    """Results to their calls by id; a result whose id names no call goes to the first call left
    without one, in order (records written before ids were kept)."""
    by_id: dict[object, ToolCall] = {call.id: call for call in calls}  # an old record's ids may be None
    unmatched = []
    for result in results:
        named = result.get("tool_call_id")
        call = by_id.get(named) if isinstance(named, str) else None  # an id of another type names no call
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


def _calls(turn: dict) -> list[ToolCall]:
    calls = []
    for entry in listed_calls(turn):
        arguments = entry.get("arguments")
        if not isinstance(arguments, str):
            arguments = dumps(arguments if arguments is not None else {})
        calls.append(ToolCall(str(entry.get("id") or ""), str(entry.get("name") or ""), arguments, NO_RESULT))
    return calls


def turns(record: dict) -> list[Turn]:
    """The assistant turns of a version-1 record, with their calls' results."""
    steps: list[Turn] = []
    for turn in record.get("conversations") or []:
        kind, value = turn.get("from"), turn.get("value")
        value = value if isinstance(value, str) else ""
        if kind == "gpt":
            calls = _calls(turn)
            reasoning, content = split_assistant(value, len(calls))
            finish = turn.get("finish_reason")
            steps.append(Turn(content, reasoning, calls, finish if isinstance(finish, str) else ""))
        elif kind == "tool" and steps:
            _attach(steps[-1].calls, _tool_results(value))
    return steps


def read(record: dict, line: bytes) -> Sample:
    """The sample of a version-1 batch line (`record` as orjson read `line`)."""
    own = {key: record.pop(key, None) for key in OWN_KEYS}
    changed = upgrade(record)  # this version's shape: a cost flag, verification values that are never null
    metadata = record["metadata"]
    system = next((t.get("value") for t in record.get("conversations") or [] if t.get("from") == "system"), "")
    source = metadata.get("source")
    return Sample(
        prompt_index=record.get("prompt_index", 0),
        sample_index=metadata.get("sample_index", 0),
        batch_num=metadata.get("batch_num", 0),
        entry=json.loads(source) if isinstance(source, str) else source or {},
        tools=list(offered_tools(system if isinstance(system, str) else "")),
        toolsets=record.get("toolsets_used") or [],
        turns=turns(record),
        api_calls=record.get("api_calls", 0),
        exit_reason=str(metadata.get("exit_reason") or ""),
        usage=metadata["usage"],
        verification=metadata["verification"],
        tool_stats=record.get("tool_stats") or {},
        model=str(metadata.get("model") or ""),
        model_reported=str(metadata.get("model_reported") or ""),
        run_name=str(metadata.get("run_name") or ""),
        duration_seconds=metadata.get("duration_seconds", 0.0),
        timestamp=str(metadata.get("timestamp") or ""),
        token_drift=metadata.get("token_drift") or "",  # JSON text (a list in some older records)
        discarded=own["discarded"],
        redactions=own["redactions"] or {},
        nonzero_exits=own["nonzero_exits"] or {},
        tokens=own["tokens"],
        legacy=record,
        # Written as it is when the merge takes nothing off it (as every main before the journal did).
        legacy_line=line if not changed and all(value is None for value in own.values()) else None,
    )
