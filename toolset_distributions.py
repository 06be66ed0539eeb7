"""Toolset distributions: each toolset is switched on independently with its probability (percent).

The names and percentages are those the Hermes agent ships, so runs are comparable with it; the last
one, `code_execution`, is ours: no Hermes distribution offers execute_code.
"""

from __future__ import annotations

import random

from trajforge import registry

ALL_SIX = ("web", "vision", "image_gen", "terminal", "file", "browser")

DISTRIBUTIONS: dict[str, dict[str, int]] = {
    "default": dict.fromkeys(ALL_SIX, 100),
    "image_gen": {"image_gen": 90, "vision": 90, "web": 55, "terminal": 45},
    "research": {"web": 90, "browser": 70, "vision": 50, "terminal": 10},
    "science": {"web": 94, "terminal": 94, "file": 94, "vision": 65, "browser": 50, "image_gen": 15},
    "development": {"terminal": 80, "file": 80, "web": 30, "vision": 10},
    "safe": {"web": 80, "browser": 70, "vision": 60, "image_gen": 60},
    "balanced": dict.fromkeys(ALL_SIX, 50),
    "minimal": {"web": 100},
    "terminal_only": {"terminal": 100, "file": 100},
    "terminal_web": {"terminal": 100, "file": 100, "web": 100},
    "creative": {"image_gen": 90, "vision": 90, "web": 30},
    "reasoning": {"web": 90, "file": 60, "terminal": 20},
    "browser_use": {"browser": 100, "web": 80, "vision": 70},
    "browser_only": {"browser": 100},
    "browser_tasks": {"browser": 97, "terminal": 15, "vision": 12},
    "terminal_tasks": {"terminal": 97, "file": 97, "web": 97, "browser": 75, "vision": 50, "image_gen": 10},
    "mixed_tasks": {"browser": 92, "terminal": 92, "file": 92, "web": 35, "vision": 15, "image_gen": 15},
    "code_execution": {"code_execution": 100, "terminal": 100, "file": 100},
}


def names() -> tuple[str, ...]:
    """What --distribution accepts: these, and any a plugin registers (trajforge/registry.py)."""
    return registry.DISTRIBUTIONS.names()


def weights(distribution: str) -> dict[str, int]:
    return registry.DISTRIBUTIONS[distribution]


def usable(distribution: str, available: set[str]) -> dict[str, int]:
    """The distribution restricted to the toolsets this run can offer."""
    return {name: pct for name, pct in weights(distribution).items() if name in available}


def sample_toolsets(weights: dict[str, int], rng: random.Random) -> list[str]:
    """One coin flip per toolset; if every flip fails, the most likely toolset is used."""
    chosen = [name for name, pct in weights.items() if rng.random() * 100 < pct]
    if not chosen and weights:
        chosen = [max(weights, key=lambda name: weights[name])]
    return sorted(chosen)


def sample_rng(seed: int, entry_key: str, sample_index: int) -> random.Random:
    """The draw of one sample: it depends only on the run seed (--seed, or the one the run's first
    invocation picked), the entry (its content key) and the sample index, never on scheduling, so a
    re-run of the same sample is offered the same tools and the samples of one entry get different draws."""
    return random.Random(f"{seed}:{sample_index}:{entry_key}")


def distributions_table(unavailable: list):
    """The --list_distributions view: every distribution with its toolsets and their probabilities, then
    what this machine cannot offer and why (`unavailable`: tools.toolsets.Unavailable items)."""
    from rich.console import Group
    from rich.table import Table

    whole = {item.toolset for item in unavailable if item.tool is None}
    partly = {item.toolset for item in unavailable if item.tool is not None}
    table = Table(title="Toolset distributions (each toolset switched on independently)")
    table.add_column("distribution", style="bold")
    table.add_column("toolsets (probability)")
    for name in names():
        parts = []
        for toolset, pct in weights(name).items():
            if toolset in whole:
                parts.append(f"[dim strike]{toolset} {pct:g}%[/][dim] (unavailable)[/]")
            else:
                parts.append(f"{toolset} {pct:g}%" + (" (partly)" if toolset in partly else ""))
        table.add_row(name, ", ".join(parts))
    if not unavailable:
        table.caption = "Every toolset is available on this machine."
        return table
    table.caption = "(partly): offered without the tools listed below; (unavailable): not offered"
    missing = Table(title="Not available on this machine")
    for column in ("toolset", "tool", "why"):
        missing.add_column(column)
    for item in unavailable:
        missing.add_row(item.toolset, item.tool or "all its tools", item.reason)
    return Group(table, missing)
