"""Rate-limit arithmetic, pure: a bucket refilled continuously at `rate` units per second that holds at
most `capacity` (a second or so of the rate, so no burst at the start of each minute). A taker may
drive the level below zero: it then waits until the refill has paid its debt, and whoever comes after
waits longer (a queue without a queue: one write per request, no polling)."""

from __future__ import annotations

from dataclasses import dataclass

BURST_SECONDS = 1.0  # what a full bucket holds, in seconds of its rate


@dataclass(frozen=True)
class Bucket:
    rate: float  # units (requests or tokens) per second
    capacity: float

    @classmethod
    def per_minute(cls, amount: float) -> Bucket:
        rate = amount / 60.0
        return cls(rate, max(1.0, rate * BURST_SECONDS))

    def level(self, level: float, updated: float, now: float) -> float:
        """The level at `now`, refilled since `updated` and capped."""
        return min(self.capacity, level + max(now - updated, 0.0) * self.rate)

    def take(self, level: float, updated: float, now: float, amount: float) -> tuple[float, float]:
        """(the new level at `now`, seconds to wait before going) for taking `amount`."""
        left = self.level(level, updated, now) - amount
        return left, max(0.0, -left / self.rate)


def backoff(strikes: int, retry_after: float | None, cap: float = 60.0) -> float:
    """How long every session pauses after the run's `strikes`-th 429 in a row: as long as the server
    asked, else half a second doubling with each strike, within `cap`."""
    if retry_after is not None:
        return min(retry_after, cap)
    return min(cap, 0.5 * 2 ** max(strikes - 1, 0))
