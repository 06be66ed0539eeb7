"""The Ray executor: each batch is a Ray task running the same worker code, at most `--num_workers`
at once, on a local Ray instance or a cluster (`--ray_address`).

Events reach the driver through a small actor; the run's money database (the response cache, the
ledger, the budget, the rate limits and the concurrency limit) through another, on the driver's node
(money/ledger.py), so they hold for the cluster as they do on one machine. Batch lines are written
either by the tasks, into a run folder every node mounts (`--ray_shared_fs`), or by the driver, from
the lines the tasks send back (no shared filesystem needed). Ray re-runs a task whose worker died; the
re-run skips the prompts of its batch that already finished, so nothing is written twice.
"""

from __future__ import annotations

import asyncio
import os
import queue
import secrets
import shutil
import tempfile
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from trajectory import verification_passed
from trajforge import journal, plugins
from trajforge.environments.programs import absolute_path_only
from trajforge.events import Claimed, Event, PromptDone
from trajforge.executors.passes import PassCounts
from trajforge.money.ledger import ActorLedger, MoneyActor
from trajforge.runfolder.folder import BatchFiles, RunFolder
from trajforge.tools.mcp import toolsets as mcp

# run_batch imports the worker: the sink actor's process imports this module, and none of the worker's (openai).
if TYPE_CHECKING:
    from trajforge.executors.worker import Batch, WorkerSetup

TASK_RETRIES = 3  # re-runs of a batch whose worker process or node died
# The sink and the money actor start again when killed from outside; a call to the sink that was on its
# way is sent again (it only records), one to the money actor is not (it pays): that batch fails.
SINK_OPTIONS = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": -1}
ACTOR_RESTARTS = -1
LOST_EVENTS = "its events were lost: the run's event actor was killed and started again"
LOOPBACK = "127.0.0.1"
FLUSH_EVERY = 0.05  # seconds a task's events wait to travel to the driver together


class Sink:
    """Collects the tasks' events for the driver and remembers which samples finished and passed.

    Killed from outside, Ray starts it again (SINK_OPTIONS) and retries the calls that were on their
    way: the new one knows nothing, which the driver sees by its `born` (drain) and makes good (RayPool)."""

    def __init__(self):
        self.born = uuid.uuid4().hex
        self.events: list[Event] = []
        self.finished: dict[int, set[tuple[int, int]]] = {}
        self.passes: dict[int, int] = {}  # prompt index -> samples passed in this run

    def put(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, PromptDone):
            self.finished.setdefault(event.batch_num, set()).add(event.unit)
            if event.passed:
                self.passes[event.index] = self.passes.get(event.index, 0) + 1

    def put_many(self, events: list[Event]) -> None:
        for event in events:
            self.put(event)

    def drain(self) -> tuple[str, list[Event]]:
        """The events since the last drain, and which incarnation of the sink held them."""
        events, self.events = self.events, []
        return self.born, events

    def restore(self, finished: dict[int, set[tuple[int, int]]], passes: dict[int, int]) -> None:
        """What the driver knows had finished and passed, for a sink started again without it."""
        for batch_num, units in finished.items():
            self.finished.setdefault(batch_num, set()).update(units)
        for index, count in passes.items():
            self.passes[index] = max(self.passes.get(index, 0), count)

    def finished_in(self, batch_num: int) -> set[tuple[int, int]]:
        return self.finished.get(batch_num, set())

    def passes_so_far(self) -> dict[int, int]:
        return self.passes

    def ping(self) -> None:
        """Answered only after every earlier call from the same caller: a task's events are in."""


class SinkEvents:
    """The worker's `events.put`: events go to the sink actor in small groups (one actor call per
    50 ms rather than one per event), without waiting for it."""

    def __init__(self, sink):
        self.sink = sink
        self.buffer: list[Event] = []
        self.timer: asyncio.TimerHandle | None = None

    def put(self, event: Event) -> None:
        self.buffer.append(event)
        if self.timer is None:
            try:
                self.timer = asyncio.get_running_loop().call_later(FLUSH_EVERY, self.flush)
            except RuntimeError:  # outside the worker's loop
                self.flush()

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.buffer:
            self.sink.put_many.remote(self.buffer)
            self.buffer = []


def run_batch(setup: WorkerSetup, batch: Batch, sink, shared_fs: bool, money) -> None:
    """One Ray task: the worker loop over one batch, minus what an earlier attempt finished, its money
    through the run's money actor. Passes for --stop_after_passes are those the driver knew when the
    task started, plus the task's own."""
    import ray

    from trajforge.executors.worker import Batch, serve  # the model client's imports (openai), here only

    absolute_path_only()  # a Ray worker's PATH is its node's: no relative folder in it either
    plugins.load(setup.config.plugins)  # this process may be new: the registry as the driver's
    mcp.register(setup.config.mcp_servers, setup.config.mcp_listing)  # as listed at the run's start
    owner = owner_of(batch)
    ray.get(money.forget.remote(owner))  # an earlier attempt's worker died: what it held is free again
    done = set(ray.get(sink.finished_in.remote(batch.num)))
    passes = dict(setup.passes_before)
    for index, count in ray.get(sink.passes_so_far.remote()).items():
        passes[index] = passes.get(index, 0) + count
    folder = RunFolder(setup.config.run_dir)
    events = SinkEvents(sink)
    if shared_fs:  # lines an earlier attempt wrote, but died before it could report them
        for line, record in folder.lines_in(folder.batch_file(batch.num), print):
            finished = journal.read(record, line)  # a line of any version
            index, sample = finished.prompt_index, finished.sample_index
            if (index, sample) not in done:
                done.add((index, sample))
                outcome = finished.discarded or finished.exit_reason
                passed = verification_passed(finished.verification)
                events.put(PromptDone(index, batch.num, outcome, 0, None, sample, passed))
    todo = Batch(batch.num, [work for work in batch.entries if (work[0], work[1]) not in done])
    tasks: queue.Queue = queue.Queue()
    for item in (todo, None) if todo.entries else (None,):
        tasks.put(item)
    counts = PassCounts.local(setup.config.stop_after_passes, passes)
    files = BatchFiles(folder) if shared_fs else None
    asyncio.run(serve(setup, tasks, events, files, counts, ActorLedger(money, owner)))
    events.flush()
    ray.get(sink.ping.remote())


def private_instance(folder: str) -> dict[str, str]:
    """The variables that make the run's own Ray instance private: every server on the loopback only
    (Ray listens on 127.0.0.1 when that is its node's address, and takes it as one only where it is
    told it has no cluster), and every call to it authenticated by a token made for this run, kept in
    a file in the instance's folder (0700, the runner's) rather than in any process's environment."""
    token = os.path.join(folder, "auth_token")
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def owner_of(batch: Batch) -> str:
    """What the money actor knows a batch's task by: each attempt at the batch is the same owner."""
    return f"batch {batch.num}"


class RayPool:
    def __init__(self, setup: WorkerSetup, num_workers: int, address: str | None, shared_fs: bool):
        self.setup = setup
        self.num_workers = num_workers
        self.address = address
        self.shared_fs = shared_fs
        self.files = None if shared_fs else BatchFiles(RunFolder(setup.config.run_dir))
        self.temp_dir: str | None = None
        self.ray: Any = None  # imported by _init(), after the variables it reads at import
        self.waiting: deque[Batch] = deque()
        self.running: dict = {}  # object ref -> batch
        self.failed: list[tuple[Batch, str]] = []
        self.sink_born: str | None = None
        self.finished: dict[int, set[tuple[int, int]]] = {}  # what the driver has seen finish, per batch
        self.passes: dict[int, int] = {}
        self.tainted: set[int] = set()  # batches running when the sink was started again

    def _init(self) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if self.address:  # the user's cluster, with the user's own authentication settings (docs/ray.md)
            import ray  # config.py has checked that it is installed

            self.ray = ray
            ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
            return
        self.temp_dir = tempfile.mkdtemp(prefix="br-ray-")  # short: Ray's socket paths must fit
        os.environ.update(private_instance(self.temp_dir))  # read when ray is imported: before it
        import ray

        self.ray = ray
        ray.init(
            num_cpus=self.num_workers,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=self.temp_dir,
            _node_ip_address=LOOPBACK,
        )

    def start(self, batches: list[Batch]) -> None:
        self._init()
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On this node, where the run folder is: the money's database is SQLite, which wants one machine; and
        # the events' sink, which a worker node's loss must not take with it (its events would be lost).
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.sink = ray.remote(**SINK_OPTIONS, scheduling_strategy=here)(Sink).remote()
        actor = ray.remote(num_cpus=0, scheduling_strategy=here, max_restarts=ACTOR_RESTARTS)(MoneyActor)
        self.money = actor.remote(self.setup.config.money.folder)
        self.task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(run_batch)
        self.waiting.extend(batches)
        self._submit()

    def _submit(self) -> None:
        while self.waiting and len(self.running) < self.num_workers:
            batch = self.waiting.popleft()
            self.running[self.task.remote(self.setup, batch, self.sink, self.shared_fs, self.money)] = batch

    def poll(self, timeout: float) -> list[Event]:
        ray = self.ray
        ready, _ = ray.wait(list(self.running), num_returns=len(self.running), timeout=0) if self.running else ([], [])
        born, events = ray.get(self.sink.drain.remote())
        if born != self.sink_born:
            self._sink_started(born)
        events = self._first_time(events)
        for ref in ready:
            batch = self.running.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:  # retries used up: its unfinished prompts fail
                self.money.forget.remote(owner_of(batch))
                self.failed.append((batch, f"Ray task failed: {type(exc).__name__}: {str(exc)[:300]}"))
            else:  # its events are all in (it waited for the sink): those still missing were lost
                if batch.num in self.tainted:
                    self.failed.append((batch, LOST_EVENTS))
        self._submit()
        if self.files is not None:  # the lines come with the events: on disk before they count
            done = [event for event in events if isinstance(event, PromptDone)]
            for fd in {self.files.write(event.batch_num, event.line) for event in done if event.line is not None}:
                os.fsync(fd)
        if not events:
            time.sleep(min(timeout, 0.1))
        return [event for event in events if not isinstance(event, Claimed)]  # the driver ignores a done line

    def _sink_started(self, born: str) -> None:
        """The sink is a new one (the first, or one started again after a kill): it learns what had
        finished; what the old one held undrained is lost, so the batches running now are suspect."""
        if self.sink_born is not None:
            self.tainted.update(batch.num for batch in self.running.values())
            self.sink.restore.remote(self.finished, self.passes)
        self.sink_born = born

    def _first_time(self, events: list[Event]) -> list[Event]:
        """The events, but a sample's second PromptDone (a batch re-run by a restarted sink's ignorance)."""
        kept = []
        for event in events:
            if isinstance(event, PromptDone):
                seen = self.finished.setdefault(event.batch_num, set())
                if event.unit in seen:
                    continue
                seen.add(event.unit)
                if event.passed:
                    self.passes[event.index] = self.passes.get(event.index, 0) + 1
            kept.append(event)
        return kept

    def lost(self, outstanding: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
        lost: dict[tuple[int, int], str] = {}
        for batch, reason in self.failed:
            for index, sample, _ in batch.entries:
                if (index, sample) in outstanding:
                    lost[index, sample] = reason
        self.failed.clear()
        return lost

    def halt(self) -> None:
        """Submit no more batches; the running tasks stop by themselves (their workers see the budget)."""
        self.waiting.clear()

    def busy(self) -> bool:
        return bool(self.running)

    def stop(self, finished: bool) -> int:
        """Ends the run's Ray instance (or leaves the cluster); returns how many tasks it cancelled."""
        ray = self.ray
        for ref in self.running:  # none left when finished
            ray.cancel(ref, force=True)
        if self.files is not None:
            self.files.close()
        if ray is not None:  # None: Ray never started
            ray.shutdown()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return len(self.running)
