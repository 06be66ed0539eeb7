"""One run: check the dataset, plan what is left, run it on the executor, merge, and summarise."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape

from toolset_distributions import DISTRIBUTIONS, usable
from trajforge.advice import Advice
from trajforge.config import RunConfig
from trajforge.dataset import Entry, UsageError, load_dataset
from trajforge.environments import SetupError, choose, prepare_run, remove_leftovers
from trajforge.environments.limits import unenforced
from trajforge.events import (
    LogLine,
    PromptDone,
    PromptEnded,
    PromptError,
    PromptFailed,
    PromptStopped,
    Retrying,
    RunRefused,
    SampleSkipped,
)
from trajforge.executors.pool import ProcessPool
from trajforge.executors.ray_pool import RayPool
from trajforge.executors.worker import Batch, WorkerSetup
from trajforge.export.publish import publish
from trajforge.export.report import ReportData
from trajforge.helpers import Helpers
from trajforge.model.client import endpoint_problem
from trajforge.money.report import money_statistics
from trajforge.money.store import Store
from trajforge.progress import ProgressView, Tally, print_budget_stop, print_summary
from trajforge.runfolder.folder import RunFolder, entry_key, passed, sample_key, write_json_atomic
from trajforge.runfolder.merge import merge
from trajforge.runfolder.state import RunState
from trajforge.samples import Plan, plan_samples
from trajforge.tools import registry

CHECKPOINT_EVERY = 1.0  # seconds; batch files, not the checkpoint, are the record of what is done


class BatchRunner:
    def __init__(self, config: RunConfig, console: Console, helpers: Helpers):
        self.config = config
        self.console = console
        self.helpers = helpers  # started by batch_runner.py: up by the time they are needed
        self.folder = RunFolder(config.run_dir)
        self.money = Store(config.run_dir)  # the response cache, the ledger and the budget: money/store.py
        self.warned: set[str] = set()

    def warn(self, text: str) -> None:
        if text not in self.warned:
            self.warned.add(text)
            self.console.print(f"[yellow]warning:[/] {escape(text)}")

    # -- planning ------------------------------------------------------------------------------
    def plan(self, entries: list[Entry]) -> Plan:
        """The samples still to run, matched by content and sample index with multiplicity."""
        finished: Counter = Counter()
        passes: Counter = Counter()
        if not self.config.resume:
            if self.folder.has_run():
                raise UsageError(
                    f"--run_name: {self.folder.path} already holds a run; pass --resume to continue it "
                    "or choose another --run_name"
                )
        else:
            for _, record in self.folder.batch_lines(self.warn):
                key = sample_key(record)
                finished[key] += 1
                passes[key] += bool(passed(record))
        return self.matched(entries, finished, passes)

    def matched(self, entries: list[Entry], finished: Counter, passed: Counter) -> Plan:
        return plan_samples(entries, finished, passed, self.config.n_samples, self.config.stop_after_passes)

    # -- running -------------------------------------------------------------------------------
    def run(self) -> int:
        started = time.monotonic()
        environment, unsandboxed = choose(self.config.environment)  # what workers use and statistics record
        self.config = config = replace(self.config, environment=environment)
        for warning in (unsandboxed, unenforced(environment.limits, environment.kind)):
            if warning:
                self.warn(warning)
        entries = load_dataset(config.dataset_file, config.max_samples)
        toolsets, missing = registry.available_toolsets(config.tools, DISTRIBUTIONS[config.distribution])
        for item in missing:
            self.warn(f"{item.tool or item.toolset} is not available here, so it is not offered: {item.reason}")
        weights = usable(config.distribution, set(toolsets))
        if not weights:
            raise UsageError(
                f"--distribution {config.distribution}: none of its toolsets is available here "
                f"({', '.join(DISTRIBUTIONS[config.distribution])}); try --distribution=terminal_only"
            )
        with self.folder.locked():
            try:
                return self._run_locked(entries, weights, toolsets, started)
            finally:
                self.money.close()

    def _run_locked(self, entries: list[Entry], weights: dict, toolsets: dict, started: float) -> int:
        config = self.config
        plan = self.plan(entries)
        pending = plan.pending
        self.folder.remove_leftovers()
        if not config.resume or self.folder.load_settings() != config.settings:  # or run.json lacks a setting
            write_json_atomic(self.folder.settings, config.settings)
        first = self.folder.next_batch_num()
        size = config.batch_size
        batches = [
            Batch(first + i, [(e.index, sample, e.data) for e, sample in pending[start : start + size]])
            for i, start in enumerate(range(0, len(pending), size))
        ]
        if config.resume:
            todo = (
                f"{len(pending)} to run"
                if config.n_samples == 1
                else (f"{len(pending)} samples of {len(plan.unfinished)} prompts to run")
            )
            self.console.print(f"Resuming {config.run_name}: {len(plan.done)} prompts already done, {todo}")
        tool_names = sorted(registry.TOOLS)
        by_index = {e.index: e.data for e in entries}
        state = RunState(self.folder, config.run_name, str(config.dataset_file), by_index, plan.done, started)
        interrupted = False
        tally = Tally(planned=len(pending), unit="samples" if config.n_samples > 1 else "prompts")
        self.money.begin()
        spent_before = self.money.totals().spent
        self.money.close()  # no connection of ours may cross the fork into the workers
        if batches:
            prepare_run(config.environment, config.resume)
            live = self.helpers.ready(config, "browser" in weights)
            if not self.helpers.serves_the_model:
                check_endpoint(live)
            setup = WorkerSetup(live, weights, toolsets, tool_names, plan.passes, plan.copies)
            interrupted = self.execute(setup, batches, state, tally)
        self.helpers.release()
        collected = ReportData(config.report_max_trajectories) if config.report else None
        observe = collected.observe if collected else None
        totals = merge(self.folder, config.require_reasoning, tool_names, self.warn, config.keep, observe)
        # The batch files, not the events that raced a kill or Ctrl-C, say what is done.
        final = self.matched(entries, totals.finished, totals.passed)
        remaining = final.unfinished
        error_counts, failed_before = self.folder.error_summary()
        money = self.money.totals()
        state.settle(final.done, [e.index for e in remaining if entry_key(e.data) in failed_before])
        stats = {
            "run_name": config.run_name,
            "model": config.model.model,
            "distribution": config.distribution,
            "environment": config.environment.kind,
            "dataset_file": str(config.dataset_file),
            "total_prompts": len(entries),
            "n_samples": config.n_samples,
            "completed": totals.completed,
            "partial": totals.partial,
            "failed": len(state.failed),
            "remaining": len(remaining),  # entries without a final outcome: failed or never reached
            "discarded_no_reasoning": totals.discarded_no_reasoning,
            "discarded_hallucinated_tools": totals.discarded_hallucinated_tools,
            "trajectories": totals.trajectories,
            "batch_size": config.batch_size,
            "total_batches": len(self.folder.batch_files()),
            "duration_seconds": state.duration_seconds,  # every invocation's, summed
            "completed_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "retries": state.retries,
            "tool_statistics": totals.tool_statistics,
            "reasoning_statistics": totals.reasoning_statistics,
            "usage": totals.usage,
            **money_statistics(money, totals.cost_known, config.money.max_cost, state.halted == "budget"),
            "errors": error_counts,
            "redactions": totals.redactions,
            "verification": totals.verification | {"skipped_after_pass": final.skipped},
        }
        write_json_atomic(self.folder.statistics, stats)
        paths = {"Trajectories": self.folder.trajectories, "Statistics": self.folder.statistics}
        if self.folder.preferences.exists():
            paths["Preference pairs"] = self.folder.preferences
        # The report lists the errors of entries with nothing left to run again (a failed sample of an
        # entry whose other samples finished is still to do).
        settled = {entry_key(e.data) for e in entries} - {entry_key(e.data) for e in remaining}
        paths.update(publish(self.folder, stats, config, collected, settled))
        tally.seconds = time.monotonic() - started
        print_summary(self.console, stats, tally, paths)
        if interrupted:
            self.console.print("[red]Interrupted.[/] Finished prompts are saved; rerun with --resume to go on.")
            return 130
        if state.stopped:
            self.console.print(
                f"[red]Stopped:[/] {escape(state.stopped)}. Fix the key or account, then rerun with --resume."
            )
            return 1
        if state.halted == "cost_unknown":
            self.console.print(
                "[red]Stopped:[/] a cost limit (--max_cost, --max_cost_per_prompt) needs the cost of every call, but "
                f"{escape(state.halt_message or 'a reply came without one')}. Set --price_input and --price_output "
                "(USD per million tokens), then rerun with --resume: the paid replies are answered from the cache."
            )
            return 2
        if state.halted == "budget":
            print_budget_stop(self.console, stats, money, spent_before, sys.argv)
            return 3
        return 1 if remaining else 0

    def execute(self, setup: WorkerSetup, batches: list[Batch], state: RunState, tally: Tally) -> bool:
        """Run the batches on the executor and follow its events, counting them in `tally`; returns True
        when interrupted."""
        config = self.config
        if config.executor == "ray":
            executor = RayPool(setup, config.num_workers, config.ray_address, config.ray_shared_fs)
        else:
            executor = ProcessPool(setup, config.num_workers)
        outstanding = {(index, sample) for batch in batches for index, sample, _ in batch.entries}
        advice = Advice(config.require_reasoning)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            executor.start(batches)
            with ProgressView(self.console, tally, config.require_reasoning, self.money.totals()) as view:

                def ended(event: PromptEnded | SampleSkipped) -> None:
                    outstanding.discard(event.unit)
                    state.record(event)
                    view.update(event)
                    for warning in advice.sample(event) if isinstance(event, PromptDone) else ():
                        self.warn(warning)

                while outstanding and not state.stopped:
                    busy = executor.busy()  # asked first: what an idle executor sent is all in the next poll
                    events = executor.poll(0.5)
                    for event in events:
                        match event:
                            case LogLine(text=text):
                                view.log(text)
                            case Retrying():
                                view.retrying(event)
                            case PromptStopped(reason=reason, message=message):
                                outstanding.discard(event.unit)
                                state.halt(reason, message)
                            case PromptDone() | PromptFailed() | RunRefused() | SampleSkipped():
                                ended(event)
                    money = self.money.totals()
                    if money.stopped:  # the budget is spent: no prompt starts, those in flight stop at their next call
                        state.halt(money.stopped)
                        executor.halt()
                    elif not events:
                        for (index, sample), reason in sorted(executor.lost(outstanding).items()):
                            ended(PromptFailed(index, None, PromptError("worker_died", reason, 1), sample))
                    view.money(money)
                    view.tick()
                    state.save_every(CHECKPOINT_EVERY)
                    if state.halted and not busy:  # its prompts in flight have stopped or finished
                        break
                for warning in advice.judge():  # a run of fewer samples than the window
                    self.warn(warning)
            return False
        except KeyboardInterrupt:
            # Finishing up (stopping workers, merging, statistics) must not be cut short by a second one.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return True
        finally:
            signal.signal(signal.SIGTERM, previous if not outstanding else signal.SIG_IGN)
            executor.stop(finished=not outstanding)
            with contextlib.suppress(SetupError):  # a worker killed after its grace period leaves containers
                remove_leftovers(self.config.environment)


def check_endpoint(config: RunConfig) -> None:
    """Before any worker starts: UsageError (exit 2) when the endpoint does not answer at all, rather
    than every prompt retrying for minutes and failing the same way."""
    problem = endpoint_problem(config.model)
    if problem:
        raise UsageError(
            f"--base_url {config.model.base_url} cannot be reached: {problem}. No prompt was sent; check that "
            "the server runs and the URL is right, then run the same command again."
        )


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
