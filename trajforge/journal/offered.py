"""The offered tools of version-2 batch lines, parsed once per distinct list, and their system text made
once.

A run offers its samples one tool list, or a few (a distribution's draws, what MCP servers listed), and
it is most of what a batch line holds (3 KB of some 150 small objects against the rest's 3 KB). `loads`
reads a line with a list it has met before without parsing that list again: the line's bytes around it
are parsed and the known list is put in its place, one list object shared by every such line (callers
must not change it). Its system text (`system`) is then made once per list, not once per sample.

The list is found by its bytes: the writer (Sample.journal) puts `"tools":[...]` right after the entry
and `"toolsets":` right after it, at the line's top level. Only a list whose bytes were seen parsed from
a whole line is known, and a line is read this way only when its bytes before the list parse as the
line's first five keys alone: anything else (an older or newer version, a nested "tools" key of the
entry, a torn line) is parsed whole, so the value is always orjson.loads(line)'s.
"""

from __future__ import annotations

from typing import Any

import orjson

from trajectory import system_turn
from trajforge.safejson import dumps

BEFORE, AFTER = b',"tools":', b',"toolsets":'
HEAD = ["version", "prompt_index", "sample_index", "batch_num", "entry"]  # the keys before the list
LAID_OUT = 2  # the version whose lines are laid out so (a later one is parsed whole until this says)
KEPT = 64  # distinct lists known at most (a run has a few): beyond it, they are met again from scratch
# Bytes of lists (and of system texts) known at most: a list parsed takes some six times its bytes, and an
# MCP server may list a different 16 MB each time. Beyond it, what is known is forgotten.
KEPT_BYTES = 16 << 20

_lists: dict[bytes, list] = {}  # a list's bytes in a line -> the list
_systems: dict[int, tuple[list, str | None]] = {}  # id of a known list -> (the list, its system text once made)
_texts: dict[bytes, str] = {}  # a list's JSON -> its system text


def loads(line: bytes) -> Any:
    """orjson.loads(line), the offered tools of a version-2 line shared with the lines before that
    offered the same (raises orjson.JSONDecodeError as it does)."""
    start = line.find(BEFORE)
    end = line.find(b"]" + AFTER, start) + 1
    if start < 0 or end <= 0:
        return orjson.loads(line)
    listed = line[start + len(BEFORE) : end]
    tools = _lists.get(listed)
    if tools is None:
        return _learn(orjson.loads(line), listed)
    try:
        head = orjson.loads(line[:start] + b"}")
        tail = orjson.loads(b"{" + line[end + 1 :])
    except orjson.JSONDecodeError:
        return orjson.loads(line)
    if not isinstance(head, dict) or list(head) != HEAD or head["version"] != LAID_OUT:
        return orjson.loads(line)
    return head | {"tools": tools} | tail


def _learn(record: Any, listed: bytes) -> Any:
    """`record` (a whole line's) with its tools known from now on when `listed` is exactly their bytes."""
    if isinstance(record, dict) and record.get("version") == LAID_OUT and orjson.dumps(record.get("tools")) == listed:
        if len(_lists) >= KEPT or sum(map(len, _lists)) + len(listed) > KEPT_BYTES:
            _lists.clear()
            _systems.clear()
        if len(listed) <= KEPT_BYTES:
            _lists[listed] = record["tools"]
            _systems[id(record["tools"])] = (record["tools"], None)
    return record


def system(tools: list[dict]) -> str:
    """The system text of an offered tool list (made once per list `loads` knows, else per call)."""
    known = _systems.get(id(tools))
    if known is None or known[0] is not tools:
        return _system(dumps(tools))
    text = known[1]
    if text is None:
        text = _system(dumps(tools))
        _systems[id(tools)] = (tools, text)
    return text


def _system(tools_json: bytes) -> str:
    """The system text of a tool list (kept by its JSON, KEPT_BYTES of them: most samples of a run are
    offered the same)."""
    text = _texts.get(tools_json)
    if text is None:
        text = system_turn(orjson.loads(tools_json))
        size = len(tools_json) + len(text)
        if len(_texts) >= KEPT or sum(len(key) + len(value) for key, value in _texts.items()) + size > KEPT_BYTES:
            _texts.clear()
        if size <= KEPT_BYTES:
            _texts[tools_json] = text
    return text
