"""What one model call cost, in US dollars: what the endpoint reported, else its tokens at the prices
the user gave (USD per million tokens), else unknown (None, never a made-up 0). Pure functions."""

from __future__ import annotations

import math
from dataclasses import dataclass

PER_TOKEN = 1e-6  # prices are given per million tokens


@dataclass(frozen=True)
class Prices:
    input: float  # USD per million prompt tokens
    output: float  # USD per million completion tokens (reasoning tokens are completion tokens)
    cached_input: float | None = None  # USD per million cached prompt tokens; None: the input price

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        fresh = prompt_tokens - cached
        return (fresh * self.input + cached * cached_price + completion_tokens * self.output) * PER_TOKEN


def plausible(value) -> float | None:
    """A number a server sent, or None when it is not one we can believe (a string, a bool, a list,
    infinity, NaN, a negative amount, beyond 2**53)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value) if 0 <= value < 2**53 else None
    return None


def _details(usage: dict, key: str) -> dict:
    found = usage.get(key)
    return found if isinstance(found, dict) else {}


def tokens(usage: dict) -> dict[str, int]:
    """The token counts of one reply's `usage`: prompt, completion, total, reasoning and cached prompt
    tokens (the last two may sit in `completion_tokens_details` and `prompt_tokens_details`; the
    images API says `input_tokens` and `output_tokens`). What is not plausible counts as nothing."""

    def count(*values) -> int:
        return int(next((n for n in map(plausible, values) if n is not None), 0.0))

    prompt = count(usage.get("prompt_tokens"), usage.get("input_tokens"))
    completion = count(usage.get("completion_tokens"), usage.get("output_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": count(usage.get("total_tokens")) or prompt + completion,
        "reasoning_tokens": count(
            usage.get("reasoning_tokens"), _details(usage, "completion_tokens_details").get("reasoning_tokens")
        ),
        "cached_tokens": min(
            count(usage.get("cached_tokens"), _details(usage, "prompt_tokens_details").get("cached_tokens")), prompt
        ),
    }


def priced(usage: dict, prices: Prices | None) -> dict:
    """One reply's usage as a record keeps it: its token counts and `cost` (reported by the endpoint,
    else computed from `prices`, else None)."""
    counted = tokens(usage)
    cost = plausible(usage.get("cost"))
    if cost is None and prices is not None:
        cost = prices.cost(counted["prompt_tokens"], counted["completion_tokens"], counted["cached_tokens"])
    return counted | {"cost": cost}


def estimate(prompt_tokens: int, max_tokens: int | None, prices: Prices | None, largest: float | None) -> float | None:
    """What a call about to start may cost, for the budget: the largest call seen so far in the run, or
    its prompt and --max_tokens at the prices, whichever is more; None when neither is known (the
    caller then lets one call at a time find out)."""
    by_price = prices.cost(prompt_tokens, max_tokens) if prices is not None and max_tokens else None
    known = [value for value in (largest, by_price) if value is not None]
    return max(known) if known else None
