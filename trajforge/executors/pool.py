"""The local executor: `--num_workers` forked worker processes pulling work from one queue.

Work goes out in slices of a batch no larger than a worker's `--concurrency`, handed over only as a
worker has a free slot, so no worker idles while another holds prompts it has not started. Workers
sharing a batch append to its file with O_APPEND, which never interleaves two lines.

An executor starts the batches, hands the driver the workers' events, tells it which prompts were
lost with a dead worker, starts nothing more once halted (the budget) and says while it is still busy,
and stops. The Ray executor (`ray_pool.py`) offers the same calls.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections import deque

from trajforge.events import Claimed, Event
from trajforge.executors.passes import PassCounts
from trajforge.executors.worker import Batch, WorkerSetup, worker_main
from trajforge.tls import tls_context

GRACE = 15.0  # seconds a worker gets to close its environments after SIGTERM
# Seconds a worker whose samples have all ended gets to exit by itself: it holds no environment then
# (each closed before its sample's line), only its clients, and what a kill leaves (its samples'
# disks, a cgroup) the run's remove_leftovers takes away.
WIND_DOWN = 5.0


class ProcessPool:
    def __init__(self, setup: WorkerSetup, num_workers: int):
        self.setup = setup
        self.num_workers = num_workers
        self.context = multiprocessing.get_context("fork")  # workers inherit the imports: no start-up cost
        self.events = self.context.Queue()
        self.tasks = self.context.Queue()
        self.waiting: deque[Batch] = deque()
        self.workers: list = []
        self.claims: dict[int, list[tuple[int, int]]] = {}  # worker pid -> the samples it took
        self.halted = False

    def start(self, batches: list[Batch]) -> None:
        unit = self.setup.config.concurrency
        self.waiting.extend(
            Batch(b.num, b.entries[i : i + unit]) for b in batches for i in range(0, len(b.entries), unit)
        )
        size = 1 + max((index for batch in batches for index, _, _ in batch.entries), default=0)
        passes = PassCounts.shared(self.setup.config.stop_after_passes, self.setup.passes_before, size)
        tls_context()  # made once here, where each worker would make its own for each of its HTTP clients
        self.workers = [
            self.context.Process(
                target=worker_main, args=(self.setup, self.tasks, self.events, os.getpid(), passes), daemon=True
            )
            for _ in range(min(self.num_workers, len(self.waiting)))
        ]
        for process in self.workers:
            process.start()
        for _ in self.workers:
            self._feed()

    def _feed(self) -> None:
        """One more slice into the queue, or the end marker. Slices go in only as workers take them,
        so a stopped run leaves no backlog in the pipe (and no feeder thread blocked on it)."""
        if self.waiting:
            self.tasks.put(self.waiting.popleft())
        else:
            self.tasks.put(None)

    def poll(self, timeout: float) -> list[Event]:
        """The events that arrived within `timeout` (at least one, or none when it ran out)."""
        try:
            found = [self.events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                found.append(self.events.get_nowait())
            except queue.Empty:
                break
        for event in found:
            if isinstance(event, Claimed):
                self.claims.setdefault(event.pid, []).extend(event.units)
                self._feed()
        return [event for event in found if not isinstance(event, Claimed)]

    def lost(self, outstanding: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
        """Samples that can no longer finish: those a dead worker (OOM, segfault) had taken, and all
        that remain once no worker is alive."""
        lost: dict[tuple[int, int], str] = {}
        for process in self.workers:
            if process.exitcode not in (None, 0) and process.pid in self.claims:
                for unit in set(self.claims.pop(process.pid)) & outstanding:
                    lost[unit] = f"worker process exited with {process.exitcode}"
        if not any(p.is_alive() for p in self.workers):
            lost.update(dict.fromkeys(outstanding - set(lost), "no worker process left"))
        return lost

    def halt(self) -> None:
        """Start nothing more (the budget is spent): workers end their prompts in flight, then exit."""
        if not self.halted:
            self.waiting.clear()
            for _ in self.workers:
                self.tasks.put(None)
            self.halted = True

    def busy(self) -> bool:
        return any(process.is_alive() for process in self.workers)

    def stop(self, finished: bool) -> int:
        """Finished workers exit by themselves (within WIND_DOWN); others get SIGTERM, which lets them
        close their environments (within GRACE). Then SIGKILL: the wait is bounded either way. Returns
        how many had to be killed."""
        self.tasks.cancel_join_thread()
        if not finished:
            for process in self.workers:
                if process.is_alive():
                    process.terminate()
        deadline = time.monotonic() + (WIND_DOWN if finished else GRACE)
        killed = 0
        for process in self.workers:
            process.join(max(deadline - time.monotonic(), 0.0))
            if process.is_alive():
                process.kill()
                process.join()
                killed += 1
        return killed
