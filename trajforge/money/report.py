"""What the run tells about money: the statistics.json entries, the progress line's figures and, when
the budget stopped the run, the budget that continues it. Pure functions over the database's totals."""

from __future__ import annotations

import math

from trajforge.money.concurrency import Concurrency
from trajforge.money.spending import MoneySettings
from trajforge.money.store import SpendingTotals

PRICE_HINT = "set --price_input and --price_output (USD per million tokens)"


def usd(amount: float) -> str:
    """An amount for people: cents from a dollar up, else four decimals (a test budget of $0.0005)."""
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.4f}"


def spent(totals: SpendingTotals) -> float | None:
    """USD paid for every call in the run folder (unfinished prompts' included); None when a paid
    call's cost is unknown: a sum that leaves it out would be a made-up figure."""
    return None if totals.unknown_calls else round(totals.spent, 8)


def money_statistics(totals: SpendingTotals, records_cost_known: bool, max_cost: float | None, stopped: bool) -> dict:
    """statistics.json's `cost_known`, `cache` and `budget`."""
    return {
        "cost_known": records_cost_known and not totals.unknown_calls,
        "cache": {"hits": totals.hits, "misses": totals.paid_calls, "saved_cost": round(totals.saved, 8)},
        "budget": {"max_cost": max_cost, "spent": spent(totals), "stopped": stopped},
    }


def concurrency_statistics(found: Concurrency | None, settings: MoneySettings) -> dict:
    """statistics.json's `concurrency`: the endpoint's limit in this invocation (its least, most and mean
    over time) and the 429s it answered. Without adaptation the limit is the start throughout; with it,
    zeros when this invocation sent the endpoint nothing."""
    if found is None:
        fixed = 0 if settings.adaptive else settings.start
        found = Concurrency(settings.adaptive, settings.start, fixed, fixed, fixed, float(fixed), 0)
    return found.as_dict()


def projected(spent_before: float, spent_now: float, ended: int, planned: int) -> float | None:
    """The run's total cost if the prompts still to run cost what this invocation's ended ones did."""
    if not ended:
        return None
    return spent_now + (spent_now - spent_before) / ended * max(planned - ended, 0)


def next_budget(spent_now: float, max_cost: float, finished: int, total: int, guess: float | None = None) -> float:
    """A budget for the rest: the whole dataset at the cost per finished entry so far (twice the
    budget when nothing finished), and at least the projected total `guess` with a tenth more, in
    whole cents, never less than what was allowed already."""
    whole = spent_now / finished * total if finished else 2 * max_cost
    return math.ceil(round(max(whole, max_cost * 1.1, (guess or 0.0) * 1.1) * 100, 6)) / 100  # 1.76, not 1.77
