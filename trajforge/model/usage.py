"""Token and cost accounting: a prompt's usage summed over its model calls (its own and its tools')."""

from __future__ import annotations

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens")


def empty_usage() -> dict:
    return dict.fromkeys(USAGE_KEYS, 0) | {"cost": 0.0}


def add_usage(total: dict, usage: dict) -> None:
    """Add one reply's `usage` to `total`; reasoning tokens may sit in `completion_tokens_details`.
    What is not a plausible number (a string, a list, infinity, beyond 2**53) counts as nothing."""
    details = usage.get("completion_tokens_details")
    details = details if isinstance(details, dict) else {}
    for key in USAGE_KEYS:
        total[key] += int(_number(usage.get(key)) or _number(details.get(key)))
    total["cost"] += _number(usage.get("cost"))


def _number(value) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 2**53:
        return float(value)
    return 0.0
