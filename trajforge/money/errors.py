"""Why a prompt stops before its next model call without an outcome of its own: it is not finished,
not failed, and `--resume` runs it again (its paid calls answered from the response cache)."""

from __future__ import annotations

from typing import ClassVar

from trajforge.events import StopReason


class SpendStop(Exception):
    """No more model calls in this run: raised through the agent loop and the tools to the worker."""

    reason: ClassVar[StopReason]


class BudgetReached(SpendStop):
    """--max_cost: the spent cost plus what the calls in flight may cost leaves no room for this call."""

    reason: ClassVar[StopReason] = "budget"


class CostUnknown(SpendStop):
    """A cost limit was set but a reply came without a cost and no prices were given."""

    reason: ClassVar[StopReason] = "cost_unknown"


def stop_for(reason: str) -> SpendStop:
    """The stop a reason in the money database stands for."""
    return CostUnknown() if reason == CostUnknown.reason else BudgetReached()
