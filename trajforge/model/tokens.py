"""--token_ids: what a chat request adds to ask for token ids and logprobs, and what is read back from
the reply (plain or streamed), as vLLM's OpenAI-compatible server sends it:

- `prompt_token_ids` at the top level (in the first chunk of a stream), the prompt as the server
  tokenized it after applying its chat template;
- `choices[0].token_ids`, the completion's ids (a piece per chunk of a stream);
- `choices[0].logprobs.content`, one entry per completion token (a piece per chunk of a stream).

llama.cpp's server has no `return_token_ids`, but its chat-completion logprobs entries carry each
token's `id`: the completion ids come from there when `token_ids` is missing (docs/tokens.md).
No I/O here, and nothing that imports the `openai` package.
"""

from __future__ import annotations

import json
from typing import ClassVar

from trajforge.events import StopReason
from trajforge.money.errors import SpendStop

REQUEST = {"return_token_ids": True, "logprobs": True}  # what every chat request adds with --token_ids


class TokensMissing(SpendStop):
    """--token_ids=required and a reply came without ids: the run stops (exit 2) before another call."""

    reason: ClassVar[StopReason] = "no_token_ids"


def _ids(value) -> list[int] | None:
    ok = isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    return value if ok else None


def _entries(choice: dict) -> list:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return content if isinstance(content, list) else []


def _logprob(entry) -> float | None:
    value = entry.get("logprob") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def turn_tokens(data: dict) -> tuple[dict, str]:
    """({prompt_token_ids, token_ids, logprobs}, why some are missing or "") of one reply. A field the
    server did not send is None; logprobs is one float per completion token."""
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    entries = _entries(choice)
    completion = _ids(choice.get("token_ids"))
    if completion is None and entries:  # llama.cpp: each logprobs entry names its token's id
        completion = _ids([entry.get("id") if isinstance(entry, dict) else None for entry in entries])
    logprobs = [_logprob(entry) for entry in entries]
    found = {
        "prompt_token_ids": _ids(data.get("prompt_token_ids")),
        "token_ids": completion,
        "logprobs": logprobs if entries and None not in logprobs else None,
    }
    missing = [key for key, value in found.items() if value is None]
    if not missing:
        return found, ""
    shown = ", ".join(sorted(data)) or "nothing"
    inner = ", ".join(sorted(choice)) or "nothing"
    return found, f"the reply had no {', '.join(missing)} (its fields: {shown}; choices[0]: {inner})"


def lacks_ids(tokens: dict) -> bool:
    """Whether a reply's tokens miss the prompt's or the completion's ids (logprobs alone may be missing)."""
    return tokens["prompt_token_ids"] is None or tokens["token_ids"] is None


def gather_chunk(data: dict, chunk: dict) -> None:
    """Add the ids and logprobs of one streamed chunk to the assembled reply `data` (stream.assemble)."""
    if _ids(chunk.get("prompt_token_ids")) is not None and "prompt_token_ids" not in data:
        data["prompt_token_ids"] = chunk["prompt_token_ids"]
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        target = data["choices"][0]
        if _ids(choice.get("token_ids")) is not None:  # in place: a reply of many chunks stays linear
            target.setdefault("token_ids", []).extend(choice["token_ids"])
        if entries := _entries(choice):
            target.setdefault("logprobs", {"content": []})["content"].extend(entries)


def drift(turns: list[dict]) -> list[int]:
    """The turns (1-based) whose prompt ids do not start with the previous turn's prompt ids followed
    by its completion ids: where the chat template was not append-only. Turns without ids are skipped."""
    broken = []
    for number in range(2, len(turns) + 1):
        before, now = turns[number - 2], turns[number - 1]
        if None in (before["prompt_token_ids"], before["token_ids"], now["prompt_token_ids"]):
            continue
        expected = before["prompt_token_ids"] + before["token_ids"]
        if now["prompt_token_ids"][: len(expected)] != expected:
            broken.append(number)
    return broken


def drift_text(turns: list[dict]) -> str:
    """metadata.token_drift: JSON text of the list, so the column has one type in every file (an
    empty list in every row of a file would type it list<null>, and the files would not load together)."""
    return json.dumps(drift(turns))
