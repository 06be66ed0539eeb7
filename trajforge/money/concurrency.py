"""Adaptive concurrency (--adaptive_concurrency), pure arithmetic: how many requests one endpoint may
have in flight across every worker process of the run, as TCP's congestion window does it (AIMD).

It starts low and grows by one per success (slow start) up to the start (--num_workers x
--concurrency); an overload (429, 503, an "overloaded" error) halves it, never below 1, and from
then on it grows by one only after a window of successes in a row. A request sent before the last
cut was sent under the old limit: its overload says nothing new and cuts nothing (a burst of 429s
is one cut, not a collapse to 1). The store (store.py) keeps one Limit per endpoint and counts the
requests in flight; this module only decides.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SLOW_START = 4  # requests in flight before the first reply says how many the endpoint takes
WINDOW = 2  # successes per request of the limit that raise it by one after a cut (two rounds of it)


@dataclass(frozen=True)
class Limit:
    start: int  # the most, and what a run without adaptation sends: --num_workers x --concurrency
    value: int  # requests in flight allowed now
    ceiling: int  # below it, each success adds one (slow start); above, a window of them does
    successes: int = 0  # in a row, since the last change
    epoch: int = 0  # cuts so far: a request remembers the epoch it was sent in

    @classmethod
    def first(cls, start: int) -> Limit:
        return cls(start, min(start, SLOW_START), start)

    def succeeded(self) -> Limit:
        if self.value >= self.start:
            return self
        if self.value < self.ceiling:
            return replace(self, value=self.value + 1, successes=0)
        if self.successes + 1 >= WINDOW * self.value:
            return replace(self, value=self.value + 1, successes=0)
        return replace(self, successes=self.successes + 1)

    def overloaded(self, sent_in: int) -> Limit:
        if sent_in != self.epoch:
            return self
        value = max(1, self.value // 2)
        return replace(self, value=value, ceiling=value, successes=0, epoch=self.epoch + 1)


@dataclass(frozen=True)
class Concurrency:
    """What statistics.json and the progress line show of one endpoint's limit in this invocation."""

    adaptive: bool
    start: int
    now: int
    low: int
    high: int
    mean: float  # over time, from the first request to the last change or now
    rate_limited: int  # 429s the endpoint answered

    def as_dict(self) -> dict:
        return {
            "adaptive": self.adaptive,
            "start": self.start,
            "min": self.low,
            "max": self.high,
            "mean": round(self.mean, 2),
            "rate_limited": self.rate_limited,
        }
