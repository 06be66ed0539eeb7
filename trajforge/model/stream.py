"""Replies as they come on the wire: a streamed reply assembled from its chunks into the shape of a
plain one, and the assistant message of either. No I/O here: the client feeds what it received."""

from __future__ import annotations

import json
from collections.abc import Iterable

from trajforge.model.retry import BadReply
from trajforge.model.tokens import gather_chunk

MESSAGE_TEXT = ("content", "reasoning", "reasoning_content")
DETAIL_TEXT = ("text", "summary", "signature", "data")  # the fields of a reasoning_details item sent in pieces


def answer(data: dict) -> dict:
    """The reply's message, or BadReply when a 200 carries an error instead (OpenRouter reports
    upstream failures this way, in the body or in the choice)."""
    choices = _dicts(data.get("choices"))
    choice = choices[0] if choices else {}
    if choice.get("error") or choice.get("finish_reason") == "error" or not isinstance(choice.get("message"), dict):
        problem = choice.get("error") or data.get("error") or data
        raise BadReply(f"reply without an answer: {json.dumps(problem)[:300]}")
    return choice["message"]


def finish_reason(data: dict) -> str:
    """Why the first choice ended (stop, tool_calls, length, content_filter), as the server said; "" when
    it did not say."""
    choices = _dicts(data.get("choices"))
    finish = choices[0].get("finish_reason") if choices else None
    return finish if isinstance(finish, str) else ""


def reported(data: dict) -> str:
    """The model name the server says answered (it may differ from the name asked for); "" when none."""
    model = data.get("model")
    return model if isinstance(model, str) else ""


def assemble(chunks: Iterable[object]) -> dict:
    """The chunks of a streamed reply (each a dict as it came) as one non-streamed reply; BadReply when
    none carried a choice (a stream of only ``[DONE]``)."""
    message: dict = {"role": "assistant", "content": ""}
    calls: dict[int, dict] = {}
    details: dict[int, dict] = {}
    data: dict = {"choices": [{"message": message}]}
    answered = False
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        data["usage"] = chunk.get("usage") or data.get("usage")
        data["model"] = reported(chunk) or data.get("model", "")
        gather_chunk(data, chunk)  # --token_ids: the ids and logprobs of this chunk, when it has any
        for choice in _dicts(chunk.get("choices")):
            answered = True
            data["choices"][0].update({k: choice[k] for k in ("finish_reason", "error") if choice.get(k)})
            delta = sent if isinstance(sent := choice.get("delta"), dict) else {}
            for key in MESSAGE_TEXT:
                if isinstance(delta.get(key), str):
                    message[key] = message.get(key, "") + delta[key]
            for part in _dicts(delta.get("reasoning_details")):
                merge_fragment(details, _index(part), part, DETAIL_TEXT)
            for part in _dicts(delta.get("tool_calls")):
                merge_tool_call(calls, part)
    if not answered:
        raise BadReply("stream ended without any choice")
    if details:
        message["reasoning_details"] = [details[i] for i in sorted(details)]
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return data


def merge_fragment(merged: dict[int, dict], index: int | None, part: dict, text_keys: tuple[str, ...]) -> None:
    """Streams send a piece of one item per chunk: join its text fields, keep its other fields. A piece
    without an index starts a new item."""
    index = len(merged) if index is None else index
    item = merged.setdefault(index, {})
    for key, value in part.items():
        if key in text_keys and isinstance(value, str):
            item[key] = item.get(key, "") + value
        elif value is not None and key not in text_keys:
            item[key] = value


def merge_tool_call(calls: dict[int, dict], part: dict) -> None:
    """Add one streamed piece of a tool call (its id, name or a piece of its arguments) to `calls`."""
    index = _index(part)
    if index is None:  # some servers leave it out: a new id starts a new call, else the last one goes on
        known = [i for i, call in calls.items() if call["id"] and call["id"] == part.get("id")]
        index = known[0] if known else (len(calls) if part.get("id") or not calls else max(calls))
    call = calls.setdefault(index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call["id"] = part.get("id") or call["id"]
    function = sent if isinstance(sent := part.get("function"), dict) else {}
    for key in ("name", "arguments"):
        if isinstance(function.get(key), str):
            call["function"][key] += function[key]


def _dicts(value) -> list[dict]:
    """The objects of a list from the wire; anything else a server sends there is ignored."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _index(part: dict) -> int | None:
    """The position a piece says it belongs to; what is not a whole number counts as none given."""
    index = part.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else None
