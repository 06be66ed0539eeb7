"""--stop_after_passes across workers: passed samples per prompt index, counted where every worker sees them."""

from __future__ import annotations

import multiprocessing
from collections import Counter


class PassCounts:
    """Passed samples per prompt index, so that no worker starts a sample of an entry that already has
    `limit` passes. A worker counts its own passes before it takes its next sample, so one worker's
    order is exact; samples other workers already started finish anyway (and count).

    `shared` counts live in memory the forked workers of this machine share; `local` ones in one
    process (a Ray task, which starts from what the driver knew)."""

    def __init__(self, limit: int | None, counts, lock=None):
        self.limit = limit
        self.counts = counts
        self.lock = lock

    @classmethod
    def shared(cls, limit: int | None, initial: dict[int, int], size: int) -> PassCounts:
        if limit is None:
            return cls(None, None)
        array = multiprocessing.get_context("fork").Array("i", max(size, 1))
        for index, count in initial.items():
            array[index] = count
        return cls(limit, array, array.get_lock())

    @classmethod
    def local(cls, limit: int | None, initial: dict[int, int]) -> PassCounts:
        return cls(limit, Counter(initial) if limit is not None else None)

    def reached(self, index: int) -> bool:
        return self.limit is not None and self.counts[index] >= self.limit

    def add(self, index: int) -> None:
        if self.limit is None:
            return
        if self.lock is None:
            self.counts[index] += 1
            return
        with self.lock:
            self.counts[index] += 1
