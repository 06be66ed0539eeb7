"""A worker process: takes batches from the task queue and runs up to `--concurrency` prompts at once,
each through the sample pipeline (pipeline/sample.py); here are only scheduling, claims, events and
batch files.

Each finished prompt is one whole line appended to its `batch_N.jsonl`, flushed and fsynced before
the parent hears of it. This is the only place where a prompt's exception becomes data (`failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import shutil
import signal
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from toolset_distributions import sample_rng, sample_toolsets
from trajectory import verification_passed
from trajforge.agent.loop import PromptLimits
from trajforge.caller import Caller
from trajforge.environments import backend_for, disk
from trajforge.errors import SetupError, SetupFailed
from trajforge.events import (
    Claimed,
    DiskLow,
    LogLine,
    PromptDone,
    PromptError,
    PromptFailed,
    PromptStopped,
    Retrying,
    RunRefused,
    SampleSkipped,
    SampleStarted,
    Warned,
)
from trajforge.executors.passes import PassCounts
from trajforge.model.chat import ChatModel
from trajforge.model.outcomes import ModelCallFailed, RunStopped
from trajforge.money.errors import SpendStop
from trajforge.money.spending import Ledger, Spending, sample_scope
from trajforge.pipeline.actors import Agent, AgentRules
from trajforge.pipeline.record import Line, TrajectoryRecorder
from trajforge.pipeline.sample import Finished, SamplePipeline
from trajforge.runconfig import RunConfig
from trajforge.runfolder.attempts import AttemptLog, unit_id
from trajforge.runfolder.folder import BatchFiles, RunFolder, entry_key
from trajforge.tools.services import ToolServices
from trajforge.tools.toolsets import every_tool
from trajforge.verification.host_folders import HostFolders

MB = 1024 * 1024
DISK_POLL = 2.0  # seconds between looks at the run folder's free disk while it is low


@dataclass(frozen=True)
class Batch:
    num: int
    entries: list  # [(prompt_index, sample_index, entry dict)]: one unit of work each


@dataclass(frozen=True)
class WorkerSetup:
    config: RunConfig
    weights: dict[str, int]  # the distribution, restricted to available toolsets
    toolsets: dict[str, list[str]]  # toolset -> the names of its tools this run offers (the registry has them)
    tool_names: list[str]  # every registered tool: the keys of tool_stats
    passes_before: dict[int, int] = field(default_factory=dict)  # prompt index -> samples passed before this run
    copies: dict[int, int] = field(default_factory=dict)  # prompt index -> its copy number (samples.Plan)
    invocation: str = ""  # this invocation's id in attempts.jsonl


class Worker:
    """Runs prompts; `files` writes their lines, or, where the driver writes them (Ray without a
    shared filesystem), each line travels in its PromptDone event. `ledger`: how the run's money
    database is reached (a Ray task's: through the run's money actor), by default opened here."""

    def __init__(
        self, setup: WorkerSetup, events, files: BatchFiles | None, passes: PassCounts, ledger: Ledger | None = None
    ):
        self.setup = setup
        self.config = config = setup.config
        self.events = events
        self.files = files
        self.passes = passes  # passed samples per entry: --stop_after_passes
        self.stopped = False  # the endpoint refused us, or the budget is spent: start nothing more
        money = config.money
        # The response cache, budget, rate limits and concurrency limit, shared by every process of the run
        # through the run folder's database.
        self.spending = Spending(money, config.secrets.redact, ledger)
        self.client = ChatModel(config.model, self.spending)
        judge = config.judge.settings(config.model)
        self.services = ToolServices(config.tools, config.model, config.secrets, self.spending, judge)
        limits = PromptLimits(money.max_cost_per_prompt, money.max_tokens_per_prompt)
        self.rules = AgentRules(
            config.max_turns, config.preamble, config.max_tool_calls_per_turn, config.prompt_timeout, limits
        )
        self.pipeline = SamplePipeline(
            backend_for(config.environment),  # shared by this process's prompts
            config.verify,
            HostFolders.of(config.dataset_file, config.task_root or ()),  # a task's `workspace`, `tests` folders
            config.setup_timeout,
            config.secrets,
            self.services,
            config.mcp_servers,
        )
        self.attempts = AttemptLog(files.folder) if files else None
        self.tools = every_tool()  # the registry's, plugins' included (a Ray worker has loaded them again)

    def _caller(self, index: int, scope: str) -> Caller:
        """Who the sample's model calls are made for: its scope, its --verbose lines, its retries' events."""
        return Caller(scope, self._logger(index), self._retry_reporter(index))

    def _logger(self, index: int):
        if not self.config.verbose:
            return None
        width = self.config.log_prefix_chars

        def log(label: str, text: str) -> None:
            # Masked before it is cut or its whitespace folded, which would break an exact copy up.
            # A retry's label and text quote the server, which may echo the request and its key.
            preview = " ".join(self.services.redact(text).split())
            preview = preview[:width] + ("…" if len(preview) > width else "")
            self.events.put(LogLine(f"[prompt {index}] {self.services.redact(label)}: {preview}"))

        return log

    def _retry_reporter(self, index: int):
        def retrying(kind: str, message: str) -> None:
            self.events.put(Retrying(index, error_type(kind), self.services.redact(message)))

        return retrying

    async def run(self, tasks) -> None:
        """Keep every slot busy: take the next batch as soon as a slot frees and the current batch
        has no prompt left to start."""
        slots = asyncio.Semaphore(self.config.concurrency)
        running: set[asyncio.Task] = set()
        try:
            await self._keep_busy(tasks, slots, running)
        finally:  # cancelled (SIGTERM, the driver gone): its prompts end now, while the client and ledger are open
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _keep_busy(self, tasks, slots: asyncio.Semaphore, running: set[asyncio.Task]) -> None:
        pending: Iterator[tuple] = iter(())
        while True:
            await slots.acquire()
            await self._room()
            if self.stopped:
                break
            item = next(pending, None)
            if item is None:
                batch = await _next_batch(tasks)
                if batch is None:
                    break
                if self.files:
                    self.files.start(batch.num, len(batch.entries))
                self.events.put(Claimed(tuple((index, sample) for index, sample, _ in batch.entries), os.getpid()))
                pending = ((batch.num, *work) for work in batch.entries)
                item = next(pending)
            batch_num, index, sample, _ = item
            if self.passes.reached(index):  # its entry passed often enough meanwhile: not started
                self.events.put(SampleSkipped(index, batch_num, sample))
                if self.files:
                    self.files.finish(batch_num)
                slots.release()
                continue
            task = asyncio.create_task(self.run_prompt(*item))
            running.add(task)
            task.add_done_callback(functools.partial(_finished, running, slots))
        await asyncio.gather(*running)

    async def _room(self) -> None:
        """Wait while the run folder's disk has less than --min_free_disk_mb free (the samples running go
        on, and write their lines); the driver is told once. Where the driver writes the lines (Ray
        without a shared filesystem), its own disk is not this worker's to watch."""
        needed = self.config.min_free_disk_mb * MB
        told = False
        while needed and self.files is not None and not self.stopped:
            if shutil.disk_usage(self.files.folder.path).free >= needed:
                return
            if not told:
                self.events.put(DiskLow(str(self.files.folder.path), self.config.min_free_disk_mb))
                told = True
            await asyncio.sleep(DISK_POLL)

    async def run_prompt(self, batch_num: int, index: int, sample: int, entry: dict) -> None:
        """One sample through the pipeline, its line delivered; an exception becomes the sample's failure,
        never the worker's."""
        key = entry_key(entry)
        drawn = sample_toolsets(self.setup.weights, sample_rng(self.config.seed, key, sample))
        toolsets = sorted({*drawn, *self.config.own_toolsets})
        tools = {name: self.tools[name] for toolset in toolsets for name in self.setup.toolsets[toolset]}
        scope = sample_scope(key, self.setup.copies.get(index, 0), sample)
        try:
            if await self.spending.stopped():  # the budget is spent: start nothing
                self.stopped = True
                return
            self.started(unit_id(key, sample, self.setup.copies.get(index, 0)))
            agent = Agent(self.client, self.rules, tools)
            metadata = {"batch_num": batch_num, "model": self.config.model.model, "run_name": self.config.run_name}
            metadata |= {"sample_index": sample}
            recorder = TrajectoryRecorder(index, entry, toolsets, self.setup.tool_names, metadata)
            done = await self.pipeline.run(entry, self._caller(index, scope), agent, recorder)
            await self.deliver((batch_num, index, sample), done)
        except RunStopped as exc:
            self.stopped = True
            self.events.put(RunRefused(index, batch_num, self.services.redact(str(exc)), sample))
        except SpendStop as exc:  # not finished, not failed: --resume runs it again, its paid calls from the cache
            self.stopped = True
            self.events.put(PromptStopped(index, batch_num, exc.reason, self.services.redact(str(exc)), sample))
        except Exception as exc:
            error = _failure(exc)
            error = replace(error, message=self.services.redact(error.message))  # error bodies may echo the request
            self.events.put(PromptFailed(index, batch_num, error, sample))
        finally:
            for text in disk.take_notes():  # what the sample's --keep_workspaces copy left out
                self.events.put(Warned(text))
            if self.files:
                self.files.finish(batch_num)

    def started(self, unit: str) -> None:
        """The sample's try counts from here, before its first step: written to attempts.jsonl where this
        process can, else told to the driver, which writes it."""
        if self.attempts is not None:
            self.attempts.started(self.setup.invocation, unit)
        else:
            self.events.put(SampleStarted(unit))

    async def deliver(self, unit: tuple[int, int, int], done: Finished[Line]) -> None:
        """The line into its batch file (or onto its event), the pass counted, the driver told; `unit`:
        (batch number, prompt index, sample index)."""
        batch_num, index, sample = unit
        result, line = done.acted.result, done.record
        if self.files:
            await self.files.append(batch_num, line.data)
        passed = verification_passed(done.acted.verification)  # None: nothing verified the sample
        if passed:  # before this slot takes its next sample
            self.passes.add(index)
        called = sum(len(turn.calls) for turn in result.turns)
        carried = None if self.files else line.data  # travels with the event where the driver writes it
        outcome = line.discarded or result.exit_reason
        offered = len(result.tools)
        self.events.put(PromptDone(index, batch_num, outcome, result.retries, carried, sample, passed, offered, called))


def _finished(running: set[asyncio.Task], slots: asyncio.Semaphore, done: asyncio.Task) -> None:
    running.discard(done)
    slots.release()


async def _next_batch(tasks) -> Batch | None:
    # A short timeout keeps the helper thread from outliving a cancelled worker.
    while True:
        try:
            return await asyncio.to_thread(tasks.get, True, 0.2)
        except queue.Empty:
            continue


async def _exit_with_parent(parent: int, task: asyncio.Task) -> None:
    """An orphaned worker must not go on writing into a run folder that a --resume may reuse."""
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    task.cancel()


def error_type(kind: str) -> str:
    """The error type of a model call that failed with this kind (retry.Decision.kind). A context overflow is
    not the API's fault but the conversation's size, and users look it up as `context_length`."""
    return kind if kind == "context_length" else f"api_{kind}"


def _failure(exc: Exception) -> PromptError:
    if isinstance(exc, ModelCallFailed):
        kind, attempts = error_type(exc.kind), exc.attempts
    elif isinstance(exc, SetupError):
        kind, attempts = "environment", 1
    elif isinstance(exc, SetupFailed):
        kind, attempts = "setup_failed", 1
    else:
        kind, attempts = f"crash_{type(exc).__name__}", 1
    message = str(exc) or type(exc).__name__
    if kind.startswith("crash_"):
        message += "\n" + "".join(traceback.format_exception(exc)[-3:])
    return PromptError(kind, message, attempts)


def _watch_children_with_pidfds() -> None:
    """Python 3.11 starts a thread per subprocess to wait for it; a pidfd costs a third less CPU.
    (3.12 and later do this by themselves.)"""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # an old kernel
        return
    watcher = asyncio.PidfdChildWatcher()
    asyncio.set_child_watcher(watcher)
    watcher.attach_loop(asyncio.get_running_loop())


async def serve(
    setup: WorkerSetup, tasks, events, files: BatchFiles | None, passes: PassCounts, ledger: Ledger | None = None
) -> None:
    """Run batches from `tasks` until its None, then release what this process holds."""
    _watch_children_with_pidfds()
    worker = Worker(setup, events, files, passes, ledger)
    try:
        await worker.run(tasks)
    finally:
        await worker.client.close()
        await worker.services.close()  # the worker's browser goes with it
        await worker.spending.close()


def worker_main(setup: WorkerSetup, tasks, events, parent: int, passes: PassCounts) -> None:
    """Entry point of a worker process. Ctrl-C goes to the parent, which ends us with SIGTERM; we
    then cancel the running prompts so their environments are closed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio.run's own
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        watchdog = asyncio.create_task(_exit_with_parent(parent, task))
        await serve(setup, tasks, events, BatchFiles(RunFolder(setup.config.run_dir)), passes)
        watchdog.cancel()

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(main())
