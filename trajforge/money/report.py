"""What the run tells about money: the statistics.json entries, the progress line's figures and, when
the budget stopped the run, the command that continues it. Pure functions over the database's totals."""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Iterable

from trajforge.money.store import Totals

HIDDEN = ("api_key", "ephemeral_system_prompt")  # never printed, not even in the command to continue
DROPPED = ("resume", "max_cost")  # the command to continue sets these itself
PRICE_HINT = "set --price_input and --price_output (USD per million tokens)"


def usd(amount: float) -> str:
    """An amount for people: cents from a dollar up, else four decimals (a test budget of $0.0005)."""
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.4f}"


def spent(totals: Totals) -> float | None:
    """USD paid for every call in the run folder (unfinished prompts' included); None when a paid
    call's cost is unknown: a sum that leaves it out would be a made-up figure."""
    return None if totals.unknown_calls else round(totals.spent, 8)


def money_statistics(totals: Totals, records_cost_known: bool, max_cost: float | None, stopped: bool) -> dict:
    """statistics.json's `cost_known`, `cache` and `budget`."""
    return {
        "cost_known": records_cost_known and not totals.unknown_calls,
        "cache": {"hits": totals.hits, "misses": totals.paid_calls, "saved_cost": round(totals.saved, 8)},
        "budget": {"max_cost": max_cost, "spent": spent(totals), "stopped": stopped},
    }


def projected(spent_before: float, spent_now: float, ended: int, planned: int) -> float | None:
    """The run's total cost if the prompts still to run cost what this invocation's ended ones did."""
    if not ended:
        return None
    return spent_now + (spent_now - spent_before) / ended * max(planned - ended, 0)


def next_budget(spent_now: float, max_cost: float, finished: int, total: int) -> float:
    """A budget for the rest: the whole dataset at the cost per finished entry so far (twice the
    budget when nothing finished), in whole cents, never less than what was allowed already."""
    guess = spent_now / finished * total if finished else 2 * max_cost
    return math.ceil(max(guess, max_cost * 1.1) * 100) / 100


def continue_command(argv: list[str], budget: float) -> str:
    """The command line `argv` again with --resume and --max_cost=`budget`; a key or ephemeral prompt
    given on it shows as a placeholder (pass it as before)."""
    program = ["python", argv[0]] if argv[0].endswith(".py") else [os.path.basename(argv[0])]
    kept = []
    for name, written in _flags(argv[1:]):
        if name in HIDDEN:
            kept.append(f"--{name}=<as before>")
        elif name not in DROPPED and not (name.startswith("no") and name[2:] in DROPPED):
            kept.extend(written)
    parts = [*program, *kept, "--resume", f"--max_cost={budget:.2f}"]
    return " ".join(part if part.endswith("=<as before>") else shlex.quote(part) for part in parts)


def _flags(arguments: list[str]) -> Iterable[tuple[str, list[str]]]:
    """(flag name, its arguments as written) of a command line: --flag=value, --flag value, --flag."""
    index = 0
    while index < len(arguments):
        written = [arguments[index]]
        index += 1
        head = written[0]
        if "=" not in head and index < len(arguments) and not arguments[index].startswith("-"):
            written.append(arguments[index])
            index += 1
        yield head.lstrip("-").partition("=")[0].replace("-", "_"), written
