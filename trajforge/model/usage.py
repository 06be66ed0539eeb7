"""Token and cost accounting: a prompt's usage summed over its model calls (its own and its tools')."""

from __future__ import annotations

from trajectory import ADDED_USAGE
from trajforge.money.pricing import plausible, tokens

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens", "cached_tokens")
# A judge's share of the totals above (verification/judge.py): its calls' tokens and their known cost.
JUDGE_KEYS = tuple(ADDED_USAGE)


def empty_usage() -> dict:
    return dict.fromkeys(USAGE_KEYS, 0) | {"cost": 0.0} | ADDED_USAGE


def judged(usage: dict) -> dict:
    """One judge call's usage (priced), marked as the judge's share: counted in the totals and apart."""
    cost = plausible(usage.get("cost"))
    return usage | {"judge_tokens": tokens(usage)["total_tokens"], "judge_cost": cost or 0.0}


def add_usage(total: dict, usage: dict) -> None:
    """Add one reply's `usage` (as priced by the client: pricing.priced) to `total`. A call whose cost
    is unknown (no `cost`, or one that is not a plausible amount) makes the total unknown: None,
    never a sum that silently leaves it out."""
    for key, value in tokens(usage).items():
        total[key] += value
    for key in JUDGE_KEYS:
        if key in usage and key in total:
            total[key] += usage[key]
    cost = plausible(usage.get("cost"))
    total["cost"] = None if cost is None or total["cost"] is None else total["cost"] + cost


def usage_total(*usages: dict) -> dict:
    """The sum of several usage totals (a prompt's own calls and its tools')."""
    total = empty_usage()
    for usage in usages:
        add_usage(total, usage)
    return total
