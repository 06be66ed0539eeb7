"""Whether the endpoint serves --model: the ids its GET /models lists (OpenAI's {"data": [{"id"}]}),
compared before any chat request, so that a misspelt model is one message instead of every prompt
failing with 404."""

from __future__ import annotations

import difflib

SHOWN = 5  # closest served models named


def served_models(payload) -> list[str] | None:
    """The model ids of a GET /models reply, or None when it is not such a list (a server without the
    route, or another shape): then nothing is compared."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None
    ids = [item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]
    return ids or None


def model_problem(model: str, served: list[str] | None) -> str | None:
    """Why --model is not among the `served` ones, naming the closest, or None."""
    if served is None or model in served:
        return None
    closest = difflib.get_close_matches(model, served, n=SHOWN, cutoff=0.3) or sorted(served)[:SHOWN]
    more = f" (of {len(served)})" if len(served) > len(closest) else ""
    return (
        f"--model {model!r} is not served here: GET /models lists {', '.join(map(repr, closest))}{more}. "
        "No prompt was sent; pass one of them as --model"
    )
