"""A worker process: takes batches from the task queue and runs up to `--concurrency` prompts at once.

Each finished prompt is one whole line appended to its `batch_N.jsonl`, flushed and fsynced before
the parent hears of it. This is the only place where a prompt's exception becomes data (`failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

from toolset_distributions import sample_rng, sample_toolsets
from trajectory import build_record, discard_reason, nonzero_exits, verification_passed, with_verification
from trajforge.agent.loop import AgentResult, PromptLimits, run_agent
from trajforge.cli.config import RunConfig
from trajforge.environments import backend_for
from trajforge.errors import SetupError
from trajforge.events import (
    Claimed,
    LogLine,
    PromptDone,
    PromptError,
    PromptFailed,
    PromptStopped,
    Retrying,
    RunRefused,
    SampleSkipped,
    SampleStarted,
)
from trajforge.model.chat import ChatModel
from trajforge.model.retry import ModelCallFailed, RunStopped
from trajforge.model.tokens import drift_text
from trajforge.model.usage import add_usage
from trajforge.money.errors import SpendStop
from trajforge.money.spending import Spending, sample_scope
from trajforge.run.samples import PassCounts
from trajforge.runfolder.attempts import AttemptLog, unit_id
from trajforge.runfolder.folder import BatchFiles, RunFolder, entry_key
from trajforge.safejson import dumps
from trajforge.tools import Tool
from trajforge.tools.services import ToolServices
from trajforge.tools.session import ToolSession
from trajforge.verification.checks import verify_sample
from trajforge.verification.tasks import SetupFailed, prepare_task


@dataclass(frozen=True)
class Batch:
    num: int
    entries: list  # [(prompt_index, sample_index, entry dict)]: one unit of work each


@dataclass(frozen=True)
class WorkerSetup:
    config: RunConfig
    weights: dict[str, int]  # the distribution, restricted to available toolsets
    toolsets: dict[str, list[Tool]]
    tool_names: list[str]  # every registered tool: the keys of tool_stats
    passes_before: dict[int, int] = field(default_factory=dict)  # prompt index -> samples passed before this run
    copies: dict[int, int] = field(default_factory=dict)  # prompt index -> its copy number (samples.Plan)
    invocation: str = ""  # this invocation's id in attempts.jsonl


class Worker:
    """Runs prompts; `files` writes their lines, or, where the driver writes them (Ray without a
    shared filesystem), each line travels in its PromptDone event."""

    def __init__(self, setup: WorkerSetup, events, files: BatchFiles | None, passes: PassCounts):
        self.setup = setup
        self.config = setup.config
        self.events = events
        self.files = files
        self.passes = passes  # passed samples per entry: --stop_after_passes
        self.stopped = False  # the endpoint refused us, or the budget is spent: start nothing more
        money = self.config.money
        # The response cache, budget and rate limits, shared through the run folder's database by the processes
        # of the machine that started the run; a Ray task on another node goes without (config.py refuses
        # --max_cost and rate limits with a cluster).
        here = socket.gethostname() == money.host and os.path.isdir(money.folder)
        self.spending = Spending(money, self.config.secrets.redact) if here else None
        self.client = ChatModel(self.config.model, self.spending)
        self.services = ToolServices(self.config.tools, self.config.model, self.config.secrets, self.spending)
        self.limits = PromptLimits(money.max_cost_per_prompt, money.max_tokens_per_prompt)
        self.environments = backend_for(self.config.environment)  # shared by this process's prompts
        self.task_base = Path(self.config.dataset_file).resolve().parent  # a task's `workspace`, `tests` folders
        self.attempts = AttemptLog(files.folder) if files else None

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
        pending = iter(())
        while True:
            await slots.acquire()
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
            task.add_done_callback(lambda done: (running.discard(done), slots.release()))
        await asyncio.gather(*running)

    async def run_prompt(self, batch_num: int, index: int, sample: int, entry: dict) -> None:
        """One sample: open its environment, run the agent, verify, finish its batch line (pure), deliver
        it; an exception becomes the sample's failure, never the worker's."""
        started = time.monotonic()
        key = entry_key(entry)
        toolsets = sample_toolsets(self.setup.weights, sample_rng(self.config.seed, key, sample))
        tools = {t.name: t for name in toolsets for t in self.setup.toolsets[name]}
        scope = sample_scope(key, self.setup.copies.get(index, 0), sample)
        env = None
        try:
            if self.spending is not None and await self.spending.stopped():  # the budget is spent: start nothing
                self.stopped = True
                return
            self.started(unit_id(key, sample, self.setup.copies.get(index, 0)))
            env = await self.open(entry, scope)
            result = await self.converse(env, entry, tools, index, scope)
            add_usage(result.usage, env.usage)  # the tools' own model calls (vision, images) count too
            # The model may quote the ephemeral prompt, a prefill message or a key a server echoed.
            self.services.secrets.redact_turns(result.turns, env.redactions)
            metadata = {"batch_num": batch_num, "sample_index": sample, "seconds": time.monotonic() - started}
            record = self.record(index, entry, result, tools, toolsets, metadata)
            # In the same environment, still open; its commands stay out of the conversation and tool_stats.
            verification = await verify_sample(self.config.verify, entry, record, result.turns, env.env, self.task_base)
            for field_name in ("output", "error"):  # a Python verifier's info and prints may quote a secret too
                verification[field_name] = env.redact(verification[field_name])
            line, reason = batch_line(record, result, verification, set(tools), dict(env.redactions))
            unit, outcome = (batch_num, index, sample), reason or result.exit_reason
            await self.deliver(unit, line, outcome, result, verification, len(tools))
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
            if env is not None:
                await env.close()
            if self.files:
                self.files.finish(batch_num)

    def started(self, unit: str) -> None:
        """The sample's try counts from here, before its first step: written to attempts.jsonl where this
        process can, else told to the driver, which writes it."""
        if self.attempts is not None:
            self.attempts.started(self.setup.invocation, unit)
        else:
            self.events.put(SampleStarted(unit))

    async def open(self, entry: dict, scope: str) -> ToolSession:
        """The sample's environment, with the task's files and setup in place before any model call."""
        env = ToolSession(await self.environments.open(entry, scope), self.services, scope)
        try:
            await prepare_task(env.env, entry, self.task_base, self.config.setup_timeout)
        except BaseException:
            await env.close()
            raise
        return env

    async def converse(self, env: ToolSession, entry: dict, tools: dict, index: int, scope: str) -> AgentResult:
        config = self.config
        return await run_agent(
            self.client,
            env,
            entry["prompt"],
            tools,
            config.max_turns,
            config.preamble,
            self._logger(index),
            max_tool_calls=config.max_tool_calls_per_turn,
            timeout=config.prompt_timeout,
            on_retry=self._retry_reporter(index),
            limits=self.limits,
            scope=scope,
        )

    def record(self, index: int, entry: dict, result: AgentResult, tools: dict, toolsets: list, metadata: dict) -> dict:
        """The sample's trajectory record; `metadata`: batch_num, sample_index and its seconds so far."""
        return build_record(
            prompt_index=index,
            entry=entry,
            turns=result.turns,
            tool_schemas=[t.schema for t in tools.values()],
            toolsets=toolsets,
            tool_names=self.setup.tool_names,
            api_calls=result.api_calls,
            exit_reason=result.exit_reason,
            usage=result.usage,
            metadata={
                "batch_num": metadata["batch_num"],
                "model": self.config.model.model,
                "model_reported": result.model_reported,
                "run_name": self.config.run_name,
                "duration_seconds": round(metadata["seconds"], 3),
                "sample_index": metadata["sample_index"],
                "token_drift": drift_text(result.tokens or []),
            },
        )

    async def deliver(
        self,
        unit: tuple[int, int, int],
        line: bytes,
        outcome: str,
        result: AgentResult,
        verification: dict,
        offered: int,
    ) -> None:
        """The line into its batch file (or onto its event), the pass counted, the driver told; `unit`:
        (batch number, prompt index, sample index), `offered` how many tools the sample was offered."""
        batch_num, index, sample = unit
        if self.files:
            await self.files.append(batch_num, line)
        passed = verification_passed(verification)  # None: nothing verified the sample
        if passed:  # before this slot takes its next sample
            self.passes.add(index)
        called = sum(len(turn.calls) for turn in result.turns)
        carried = None if self.files else line  # travels with the event where the driver writes it
        self.events.put(PromptDone(index, batch_num, outcome, result.retries, carried, sample, passed, offered, called))


def batch_line(
    record: dict, result: AgentResult, verification: dict, offered: set[str], redactions: dict
) -> tuple[bytes, str | None]:
    """The sample's line of its batch file, and why the merge drops it (None: kept). Pure: the record
    with its verification and the keys the merge takes off again (discarded, redactions, tokens,
    nonzero_exits)."""
    record = {**record, "metadata": dict(record["metadata"])}
    with_verification(record, verification)
    reason = discard_reason(result.turns, offered)
    if reason:
        record["discarded"] = reason
    if redactions:  # for statistics.json; the merge takes it off, as it does `discarded`
        record["redactions"] = redactions
    if result.tokens is not None:  # for tokens.jsonl; the merge takes it off trajectories.jsonl
        record["tokens"] = {"turns": result.tokens, "missing": result.tokens_missing}
    exits = nonzero_exits(result.turns)
    if exits:  # for the summary's tool table; taken off by the merge too
        record["nonzero_exits"] = exits
    return dumps(record) + b"\n", reason  # what orjson cannot encode kept as text


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


async def serve(setup: WorkerSetup, tasks, events, files: BatchFiles | None, passes: PassCounts) -> None:
    """Run batches from `tasks` until its None, then release what this process holds."""
    _watch_children_with_pidfds()
    worker = Worker(setup, events, files, passes)
    try:
        await worker.run(tasks)
    finally:
        await worker.client.close()
        await worker.services.close()  # the worker's browser goes with it
        if worker.spending is not None:
            await worker.spending.close()


def worker_main(setup: WorkerSetup, tasks, events, parent: int, passes: PassCounts) -> None:
    """Entry point of a worker process. Ctrl-C goes to the parent, which ends us with SIGTERM; we
    then cancel the running prompts so their environments are closed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> None:
        task = asyncio.current_task()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        watchdog = asyncio.create_task(_exit_with_parent(parent, task))
        await serve(setup, tasks, events, BatchFiles(RunFolder(setup.config.run_dir)), passes)
        watchdog.cancel()

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(main())
