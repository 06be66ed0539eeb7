"""JSON that any value can pass through: the one nesting limit of the run, a parser that keeps to it,
and the writer of every record, cache entry and export, which keeps what orjson cannot encode as
escaped text instead of failing (issue 23).

orjson writes at most 254 levels and refuses strings with a lone surrogate (which Python's json reads
from a `\\ud800` escape). What a reply or a dataset line parses to is held to MAX_DEPTH, with a margin
for the levels a record wraps around it; what still cannot be encoded is kept as text: a string with
lone surrogates as its backslash-escaped form, a container too deep as {"_unparsed": "<its JSON text>"}
(the form ATIF's exporter gives arguments that are not an object)."""

from __future__ import annotations

import json
from typing import Any

import orjson

MAX_DEPTH = 200  # levels of a parsed value (a scalar is 0): records hold it a few levels down
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"
LONE_SURROGATE = "holds a lone surrogate (\\ud800 to \\udfff), which is not text"
UNPARSED = "_unparsed"


def depth(value: Any) -> int:
    """Levels of nesting of a JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def parse(text: str | bytes) -> Any:
    """The JSON value of `text`; ValueError when it is not JSON, is nested deeper than MAX_DEPTH or
    holds a lone surrogate (orjson refuses one, raw or escaped, and stops at 1024 levels itself)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:  # its own words for these two are obscure
        if "depth limit" in str(exc):
            raise orjson.JSONDecodeError(TOO_DEEP, exc.doc, exc.pos) from None
        if "surrogate" in str(exc):
            raise orjson.JSONDecodeError(LONE_SURROGATE, exc.doc, exc.pos) from None
        raise
    if _may_nest_deeper(text) and depth(value) > MAX_DEPTH:
        raise ValueError(TOO_DEEP)
    return value


def _may_nest_deeper(text: str | bytes) -> bool:
    """Whether `text` has more openings than MAX_DEPTH levels (a cheap bound: walking the value is
    not, and most texts hold a few, inside strings included)."""
    if isinstance(text, str):
        return text.count("[") + text.count("{") > MAX_DEPTH
    return text.count(b"[") + text.count(b"{") > MAX_DEPTH


def parse_lenient(text: str | bytes) -> Any:
    """Like parse, but a lone surrogate is kept, escaped (`\\ud800` as six characters), as a server's
    reply needs: its text is data, and only what must run (a call's arguments) is refused for it."""
    try:
        return parse(text)  # what orjson reads holds no lone surrogate
    except orjson.JSONDecodeError:
        try:  # Python's parser takes lone surrogates; it recurses per level, which ends at a limit
            value = json.loads(text)
        except RecursionError:
            raise ValueError(TOO_DEEP) from None
    if depth(value) > MAX_DEPTH:
        raise ValueError(TOO_DEEP)
    return writable(value)


def escaped(text: str) -> str:
    """`text` with each lone surrogate as its escape (`\\ud800`); any other text as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def writable(value: Any, level: int = 1) -> Any:
    """`value` as orjson can write it: strings (keys too) with lone surrogates escaped, integers
    beyond 64 bits as their digits, containers below MAX_DEPTH levels kept as {"_unparsed": their
    JSON text}."""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)  # beyond orjson's 64 bits (Python's json reads any integer)
    if not isinstance(value, (dict, list)):
        return value
    if level > MAX_DEPTH:
        return {UNPARSED: _text(value)}
    if isinstance(value, dict):
        return {escaped(str(key)): writable(item, level + 1) for key, item in value.items()}
    return [writable(item, level + 1) for item in value]


def _text(value: Any) -> str:
    try:
        return json.dumps(value)  # ASCII: lone surrogates come out as escapes
    except (RecursionError, ValueError, TypeError):
        return f"<a value {TOO_DEEP}, not kept>"


def dumps(value: Any, option: int | None = None) -> bytes:
    """`value` as JSON bytes (orjson), what it cannot encode kept as escaped text (writable)."""
    try:
        return orjson.dumps(value, option=option)
    except orjson.JSONEncodeError:
        return orjson.dumps(writable(value), option=option)
