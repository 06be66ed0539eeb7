"""What one reply cost, read before anything else of it (issue 23): the cost the endpoint reported, else
its tokens at the user's prices, but only tokens a request could have produced. A reply whose usage is
missing, not a number, negative, or beyond what the request allows has an unknown cost (None), which
under a cost limit stops the run, instead of a made-up $0. Pure functions."""

from __future__ import annotations

from trajforge.money.pricing import Prices, plausible, tokens

PROMPT_SLACK = 100  # prompt tokens beyond this many times the request's estimated size are not believed
MAX_COMPLETION = 10**7  # completion tokens believed at most, without --max_tokens


def reply_usage(data) -> dict:
    """The `usage` object of a reply; {} when it has none (or something else there)."""
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else {}


def _count(usage: dict, *names: str) -> int | None:
    """The first of `names` that `usage` has, as a whole number of tokens; None when none is."""
    for name in names:
        value = plausible(usage.get(name))
        if value is not None and value == int(value):
            return int(value)
    return None


def reply_cost(data, prices: Prices | None, request_tokens: int, max_tokens: int | None) -> float | None:
    """The cost in USD of the reply `data` to a request of about `request_tokens` tokens allowed
    `max_tokens` (None: not limited); None when nobody can know it."""
    usage = reply_usage(data)
    reported = plausible(usage.get("cost"))
    if reported is not None or prices is None:
        return reported
    prompt = _count(usage, "prompt_tokens", "input_tokens")
    completion = _count(usage, "completion_tokens", "output_tokens")
    if prompt is None or completion is None:
        return None
    if prompt > PROMPT_SLACK * max(request_tokens, 1) or completion > (max_tokens or MAX_COMPLETION):
        return None
    return prices.cost(prompt, completion, tokens(usage)["cached_tokens"])


def billed(data) -> bool:
    """Whether the endpoint charges for the reply `data`: it reports usage or carries an answer (a
    chat message, images); an error sent as a 200 with neither is a failure, not a paid call."""
    if not isinstance(data, dict):
        return False
    if data.get("usage") is not None or data.get("data"):
        return True
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(first, dict) or first.get("error") or first.get("finish_reason") == "error":
        return False
    return isinstance(first.get("message"), dict)
