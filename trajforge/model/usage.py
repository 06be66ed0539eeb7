"""Token and cost accounting: a prompt's usage summed over its model calls (its own and its tools')."""

from __future__ import annotations

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens")


def empty_usage() -> dict:
    return dict.fromkeys(USAGE_KEYS, 0) | {"cost": 0.0}


def add_usage(total: dict, usage: dict) -> None:
    """Add one reply's `usage` to `total`; reasoning tokens may sit in `completion_tokens_details`."""
    details = usage.get("completion_tokens_details") or {}
    for key in USAGE_KEYS:
        total[key] += int(usage.get(key) or details.get(key) or 0)
    total["cost"] += float(usage.get("cost") or 0.0)
