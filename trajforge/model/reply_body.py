"""A reply's body read as data (issue 23): any JSON value, any depth, any string a server sends ends
as a reply the loop can use and every writer can hold, or as UnreadableReply, a bad reply that is
retried. It was paid for all the same: its cost, unknown, is counted before it is retried."""

from __future__ import annotations

from trajforge import safejson
from trajforge.model.retry import BadReply


class UnreadableReply(BadReply):
    """A 200 whose body is not a JSON object within the run's nesting limit (or not even text)."""


def decode(content: bytes) -> dict:
    """The reply object of a plain body, its lone surrogates escaped; UnreadableReply otherwise."""
    try:
        data = safejson.parse_lenient(content)
    except ValueError as exc:
        raise UnreadableReply(f"reply is not JSON we can read ({exc}): {content[:200]!r}") from None
    if not isinstance(data, dict):
        raise UnreadableReply(f"reply is not a JSON object: {content[:200]!r}")
    return data


def readable(data: dict) -> dict:
    """A streamed reply's assembled object, held to the same limits as a plain one."""
    if safejson.depth(data) > safejson.MAX_DEPTH:
        raise UnreadableReply(f"streamed reply {safejson.TOO_DEEP}")
    return safejson.writable(data)
