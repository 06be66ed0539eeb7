"""One run: check the dataset, plan what is left, run it on the executor, merge, and summarise."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape

import toolset_distributions
from trajforge.environments import backend_class, disk, liveness, prepare_run, removing_leftovers, userns
from trajforge.environments.limits import unenforced
from trajforge.environments.local import ROOT_LOCAL_VERIFIED
from trajforge.errors import UsageError
from trajforge.events import (
    DiskLow,
    LogLine,
    PromptDone,
    PromptEnded,
    PromptError,
    PromptFailed,
    PromptStopped,
    Retrying,
    RunRefused,
    SampleSkipped,
    SampleStarted,
    Warned,
)
from trajforge.executors.pool import WIND_DOWN, ProcessPool
from trajforge.executors.ray_pool import RayPool
from trajforge.executors.worker import Batch, WorkerSetup
from trajforge.export.publish import Exports, publish
from trajforge.export.report import ReportData
from trajforge.failures import BUDGET, ENDPOINT, INTERRUPTED
from trajforge.model.client import endpoint_problem
from trajforge.model.served import model_problem
from trajforge.model.tokens import TokensMissing
from trajforge.money.concurrency import Concurrency
from trajforge.money.errors import stop_for
from trajforge.money.report import concurrency_statistics, money_statistics
from trajforge.money.store import SpendingTotals, Store
from trajforge.run.advice import Advice
from trajforge.run.continuation import continue_command
from trajforge.run.dataset import Entry
from trajforge.run.dry_run import dry_run
from trajforge.run.helper_processes import Helpers
from trajforge.run.progress import ProgressView, Tally, print_budget_stop, print_summary, summary_json
from trajforge.run.rescore import rescore_all
from trajforge.run.samples import Plan, plan_samples
from trajforge.run.task_folders import environment_for
from trajforge.run.task_images import build_images
from trajforge.runconfig import RunConfig
from trajforge.runfolder.attempts import EXHAUSTED, AttemptLog, History, new_invocation, unit_id
from trajforge.runfolder.folder import RunFolder, entry_key, passed, sample_key, write_json_atomic
from trajforge.runfolder.merge import TrajectoryTotals, listed_tool_names, merge
from trajforge.runfolder.state import RunState
from trajforge.tools.mcp import toolsets as mcp
from trajforge.tools.toolsets import available_toolsets, every_tool

UNPRICED = (
    "Set --price_input and --price_output (USD per million tokens) on this command (the paid replies are "
    "answered from the cache):"
)
CHECKPOINT_EVERY = 1.0  # seconds; batch files, not the checkpoint, are the record of what is done


class BatchRunner:
    def __init__(self, config: RunConfig, console: Console, helpers: Helpers, notes: Console | None = None):
        self.config = config
        self.console = console  # results: the summary, the paths, the command that goes on (stdout)
        self.notes = notes or Console(stderr=True, highlight=False, soft_wrap=True)  # warnings, progress
        self.helpers = helpers  # started by batch_runner.py: up by the time they are needed
        self.folder = RunFolder(config.run_dir)
        self.money = Store(config.run_dir)  # the response cache, the ledger and the budget: money/store.py
        self.warned: set[str] = set()
        self.leftovers: threading.Thread | None = None  # removing what the workers left (execute)

    def warn(self, text: str) -> None:
        if text not in self.warned:
            self.warned.add(text)
            self.notes.print(f"[yellow]warning:[/] {escape(text)}")

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
        """What is left: the samples without a line, less those a resume does not send again (out of
        --max_attempts, or failed at the endpoint for good without --retry_failed=endpoint)."""
        config = self.config
        plan = plan_samples(entries, finished, passed, config.n_samples, config.stop_after_passes)
        if self.folder.path.exists():
            history = History.read(self.folder)
            plan.hold_back(
                lambda key, sample, copy: history.held_back(
                    unit_id(key, sample, copy), config.max_attempts, config.retry_failed
                )
            )
        return plan

    # -- running -------------------------------------------------------------------------------
    def run(self, entries: list[Entry], notes: list[str]) -> int:
        """The run over `entries` (task_folders.load_entries(), with the `notes` it had to print)."""
        started = time.monotonic()
        # What workers use and statistics record: docker for task folders, else the --environment=auto pick.
        environment, unsandboxed = environment_for(self.config.environment, entries)
        self.config = config = replace(self.config, environment=environment)
        limits, kind, enforcer = environment.limits, environment.kind, backend_class(environment.kind).LIMITS
        for warning in (
            unsandboxed,
            unenforced(limits, kind, enforcer),
            disk.unenforced(limits.max_disk_mb, kind, enforcer),
            *notes,
        ):
            if warning:
                self.warn(warning)
        if any("tests" in entry.data for entry in entries) and not userns.has_two_uids(environment.kind):
            self.warn(userns.one_uid_warning(environment.kind))
        verified = config.verify.verifier or any({"verify", "tests"} & set(entry.data) for entry in entries)
        if kind == "local" and verified and os.geteuid() == 0:
            self.warn(ROOT_LOCAL_VERIFIED)
        if config.mcp_servers:  # what they offer, asked once, before anything else of the run starts
            self.config = config = replace(config, mcp_listing=mcp.started(config.mcp_servers, environment))
        wanted = [*toolset_distributions.weights(config.distribution), *config.own_toolsets]
        toolsets, missing = available_toolsets(config.tools, wanted)
        for item in missing:
            self.warn(f"{item.tool or item.toolset} is not available here, so it is not offered: {item.reason}")
        weights = toolset_distributions.usable(config.distribution, set(toolsets))
        if not weights:
            raise UsageError(
                f"--distribution {config.distribution}: none of its toolsets is available here "
                f"({', '.join(toolset_distributions.weights(config.distribution))}); try --distribution=terminal_only"
            )
        if config.dry_run:  # the checks a run makes before its first request, then what it would do
            plan = self.plan(entries)
            check_endpoint(self.helpers.ready(config, "browser" in weights))
            return dry_run(self.console, config, plan)
        with self.folder.locked():
            try:
                return self._run_locked(entries, weights, toolsets, started)
            finally:
                self.money.close()

    def _run_locked(self, entries: list[Entry], weights: dict, toolsets: dict, started: float) -> int:
        prepared = self.prepare(entries, started)
        offered = {name: [tool.name for tool in tools] for name, tools in toolsets.items()}
        tools = (weights, offered, prepared.tool_names)
        try:
            interrupted = False
            if self.config.rescore:  # no agent: the finished samples verified again, then the merge
                self.rescore(entries, prepared)
            elif prepared.batches:
                interrupted = self.start(prepared.batches, prepared, tools)
            if not prepared.batches and self.config.resume and self.leftovers is None:
                # Nothing to run: a killed run's leftovers go all the same. Its marker held as a start holds it:
                # another run's start leaves them to this removal (both removed them at once), and the marker goes
                # at this end, not at a later start (review 21).
                liveness.hold(self.config.environment)
                self.leftovers = removing_leftovers(self.config.environment)
            self.helpers.release()
            return self.finish(entries, prepared, interrupted, started)
        finally:
            if self.leftovers is not None:
                self.leftovers.join()
                liveness.release(self.config.environment)  # nothing of it left here for a later start to remove
            for text in disk.take_notes():  # a killed run's kept workspaces (remove_leftovers, in this process)
                self.warn(text)

    def prepare(self, entries: list[Entry], started: float) -> Prepared:
        """Before any worker starts: the plan, run.json, the batches, the checkpoint's state, the budget."""
        config = self.config
        plan = self.plan(entries)
        pending = plan.pending
        self.folder.remove_leftovers()
        if not config.resume or self.folder.load_settings() != config.settings:  # or run.json lacks a setting
            write_json_atomic(self.folder.settings, config.settings)
        first, size = self.folder.next_batch_num(), config.batch_size
        batches = [
            Batch(first + i, [(e.index, sample, e.data) for e, sample in pending[start : start + size]])
            for i, start in enumerate(range(0, len(pending), size))
        ]
        if config.resume:
            self.announce(plan)
        by_index = {e.index: e.data for e in entries}
        state = RunState(
            self.folder, config.run_name, str(config.dataset_file), by_index, plan.done, started, plan.copies
        )
        tally = Tally(planned=len(pending), unit="samples" if config.n_samples > 1 else "prompts")
        self.money.begin()
        spent_before = self.money.totals().spent
        self.money.close()  # no connection of ours may cross the fork into the workers
        return Prepared(plan, batches, state, tally, spent_before, sorted(every_tool()), new_invocation())

    def finish(self, entries: list[Entry], prepared: Prepared, interrupted: bool, started: float) -> int:
        """After the workers: merge, statistics.json, exports and report, the summary; the exit status."""
        config, state, tally = self.config, prepared.state, prepared.tally
        collected = ReportData(config.report_max_trajectories) if config.report else None
        observe = collected.observe if collected else None
        tokens = config.model.token_ids != "off" or self.folder.tokens.exists()
        names = prepared.tool_names
        if config.mcp_servers:  # a sample is offered what its servers list for it: a tool others were not
            names = listed_tool_names(self.folder, names)
        exports = Exports(self.folder, config.exports, config.run_name)
        try:
            totals = merge(
                self.folder, config.require_reasoning, names, self.warn, config.keep, observe, tokens, exports.write
            )
        except BaseException:
            exports.abort()
            raise
        exported = exports.commit()
        if totals.tokens.missing and config.model.token_ids == "on":
            self.warn(f"--token_ids: {config.model.base_url} answered without token ids: {totals.tokens.missing}")
        # The batch files, not the events that raced a kill or Ctrl-C, say what is done.
        final = self.matched(entries, totals.finished, totals.passed)
        remaining = final.unfinished
        error_counts, failed_before = self.folder.error_summary()
        state.settle(final.done, [e.index for e in remaining if entry_key(e.data) in failed_before])
        counts = {"total_prompts": len(entries), "total_batches": len(self.folder.batch_files())}
        completed_at = datetime.now(UTC).isoformat(timespec="seconds")
        limit = self.money.concurrency(config.model.base_url)
        stats = statistics(config, totals, final, state, self.money.totals(), error_counts, counts, completed_at, limit)
        write_json_atomic(self.folder.statistics, stats)
        paths = {"Trajectories": self.folder.trajectories, "Statistics": self.folder.statistics}
        paths |= {"Preference pairs": self.folder.preferences} if self.folder.preferences.exists() else {}
        # The report lists the errors of entries with nothing left to run again (a failed sample of an
        # entry whose other samples finished is still to do).
        settled = {entry_key(e.data) for e in entries} - {entry_key(e.data) for e in remaining}
        paths.update(publish(self.folder, stats, config, collected, settled, exported))
        tally.seconds = time.monotonic() - started
        print_summary(self.console, stats, tally, paths)
        code, why, command = self.ending(state, interrupted, stats, prepared.spent_before, tally, final)
        if config.summary_json:  # for a script's jq; the console above went to stderr
            print(summary_json(stats, code, why, command, paths), flush=True)
        return code

    def rescore(self, entries: list[Entry], prepared: Prepared) -> None:
        """--rescore: every finished sample verified again (run/rescore.py); the endpoint is not even asked
        for its models (only a judge there is called)."""
        prepare_run(self.config.environment, True)
        live = self.helpers.ready(self.config, False)
        done = asyncio.run(rescore_all(live, self.folder, entries, prepared.plan.copies, self.warn))
        # What its verifications left goes as a run's does, then its marker (prepare_run held it): not left for every
        # later start to look at.
        self.leftovers = removing_leftovers(self.config.environment)
        diverged = f", {done.diverged} diverged in replay" if done.diverged else ""
        failed = f", {done.failed} kept their verification (see the warnings)" if done.failed else ""
        self.console.print(f"Re-scored {done.samples} samples into {done.file}{diverged}{failed}")

    def start(self, batches: list[Batch], prepared: Prepared, tools: tuple) -> bool:
        """Check the endpoint and run the batches (see execute); `tools`: (weights, toolsets, tool names)."""
        weights, toolsets, tool_names = tools
        plan = prepared.plan
        prepare_run(self.config.environment, self.config.resume)
        build_images(
            (entry.data for entry, _ in plan.pending),
            self.config.environment.run_dir,
            self.console.print,
            self.config.environment.limits.max_processes,
        )
        live = self.helpers.ready(self.config, "browser" in weights)
        if not self.helpers.serves_the_model:
            check_endpoint(live)
        setup = WorkerSetup(live, weights, toolsets, tool_names, plan.passes, plan.copies, prepared.invocation)
        return self.execute(setup, batches, prepared.state, prepared.tally)

    def announce(self, plan: Plan) -> None:
        """What a resume has left to do, and the may-change settings it changes (said once, by the
        invocation that makes the change)."""
        config, pending = self.config, plan.pending
        todo = (
            f"{len(pending)} to run"
            if config.n_samples == 1
            else f"{len(pending)} samples of {len(plan.unfinished)} prompts to run"
        )
        if config.rescore:
            todo = f"their samples verified again ({len(pending)} unfinished are left for a plain --resume)"
        self.console.print(f"Resuming {config.run_name}: {len(plan.done)} prompts already done, {todo}")
        held = Counter(plan.held.values())
        if held:
            self.console.print(
                f"Not sent again: {held[EXHAUSTED]} sample(s) out of --max_attempts={config.max_attempts}, "
                f"{held[ENDPOINT]} failed at the endpoint for good (--retry_failed=endpoint sends those)"
            )
        for change in config.changes:
            self.notes.print(change, markup=False)

    def ending(
        self, state: RunState, interrupted: bool, stats: dict, spent_before: float, tally: Tally, final: Plan
    ) -> tuple[int, str, str]:
        """(the exit status, why, the command that goes on); for an exit that can be continued, prints
        what happened and that command (no placeholders: a secret given as a flag is left out, with a
        note to pass it)."""
        retryable = len({entry.index for entry, _ in final.pending})
        code, why = exit_code(interrupted, state.stopped, state.halted, stats["remaining"], retryable)
        if not code:
            return 0, why, ""
        changes: dict[str, str] = {}
        if why == "budget":
            budget = print_budget_stop(self.console, stats, self.money.totals(), spent_before, tally)
            changes = {"max_cost": f"{budget:.2f}"}
        elif why == EXHAUSTED:
            changes = given_up(self.console, stats, self.config.max_attempts)
        else:
            self.console.print(_ENDINGS[why](state))
        command, notes = continue_command(sys.argv, changes)
        self.console.print(command, markup=False, highlight=False)
        for note in notes:
            self.console.print(f"(a secret is never saved: {note})", markup=False, highlight=False)
        return code, why, command

    def execute(self, setup: WorkerSetup, batches: list[Batch], state: RunState, tally: Tally) -> bool:
        """Run the batches on the executor and follow its events, counting them in `tally`; returns True
        when interrupted."""
        config = self.config
        executor: RayPool | ProcessPool
        if config.executor == "ray":
            executor = RayPool(setup, config.num_workers, config.ray_address, config.ray_shared_fs)
        else:
            executor = ProcessPool(setup, config.num_workers)
        units = {
            (index, sample): unit_id(entry_key(data), sample, setup.copies.get(index, 0))
            for batch in batches
            for index, sample, data in batch.entries
        }
        outstanding = set(units)
        attempts = AttemptLog(self.folder)

        def release(which, why: str) -> None:  # started, but not a try (runfolder/attempts.py)
            attempts.released(setup.invocation, [units[unit] for unit in which], why)

        advice = Advice(config.require_reasoning)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            executor.start(batches)
            with ProgressView(self.notes, tally, config.require_reasoning, self.money.totals()) as view:

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
                            case Warned(text=text):
                                self.warn(text)
                            case Retrying():
                                view.retrying(event)
                            case SampleStarted(unit=unit):
                                attempts.started(setup.invocation, unit)
                            case PromptStopped(reason=reason, message=message):
                                outstanding.discard(event.unit)
                                state.halt(reason, message)
                                state.stop(event)
                                release([event.unit], BUDGET)
                            case DiskLow(folder=folder, needed_mb=needed):
                                self.warn(
                                    f"the run folder's disk ({folder}) has less than {needed} MB free "
                                    "(--min_free_disk_mb): no new sample starts until it has more; the samples "
                                    "running go on"
                                )
                            case RunRefused():
                                release([event.unit], "refused")  # the key's fault, not the sample's
                                ended(event)
                            case PromptDone() | PromptFailed() | SampleSkipped():
                                ended(event)
                    money = self.money.totals()
                    if money.stopped:  # the budget is spent: no prompt starts, those in flight stop at their next call
                        state.halt(stop_for(money.stopped).reason)
                        executor.halt()
                    elif not events:
                        for (index, sample), why in sorted(executor.lost(outstanding).items()):
                            ended(PromptFailed(index, None, PromptError("worker_died", why, 1), sample))
                    view.money(money, self.money.concurrency(config.model.base_url))
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
            release(outstanding, INTERRUPTED)  # pending, not tried: a start of this invocation is taken back
            return True
        finally:
            signal.signal(signal.SIGTERM, previous if not outstanding else signal.SIG_IGN)
            if executor.stop(finished=not outstanding) and not outstanding:
                self.warn(
                    f"a worker process had not exited {WIND_DOWN:g} s after its samples ended and was killed "
                    "(a thread that a plugin or a --tools function started, still running?)"
                )
            # A worker killed after its grace period leaves containers; each leaves its samples' disks.
            self.leftovers = removing_leftovers(self.config.environment)


@dataclass(frozen=True)
class Prepared:
    """What a run has before its workers start (BatchRunner.prepare)."""

    plan: Plan
    batches: list[Batch]
    state: RunState
    tally: Tally
    spent_before: float  # USD spent on this folder before this invocation
    tool_names: list[str]  # every registered tool: the keys of tool_stats
    invocation: str  # this invocation's id in attempts.jsonl


def statistics(
    config: RunConfig,
    totals: TrajectoryTotals,
    final: Plan,
    state: RunState,
    money: SpendingTotals,
    errors: dict,
    counts: dict,
    completed_at: str,
    concurrency: Concurrency | None,
) -> dict:
    """statistics.json, from what the merge totalled, what is left (`final`), the run's state and money
    (`concurrency`: the endpoint's limit in this invocation); `counts`: total_prompts and total_batches."""
    return {
        "run_name": config.run_name,
        "model": config.model.model,
        "distribution": config.distribution,
        "environment": config.environment.kind,
        "dataset_file": str(config.dataset_file),
        "total_prompts": counts["total_prompts"],
        "n_samples": config.n_samples,
        "completed": totals.completed,
        "partial": totals.partial,
        "failed": len(state.failed),
        "remaining": len(final.unfinished),  # entries without a final outcome: failed or never reached
        "discarded_no_reasoning": totals.discarded_no_reasoning,
        "discarded_hallucinated_tools": totals.discarded_hallucinated_tools,
        "trajectories": totals.trajectories,
        "replay_diverged": totals.replay_diverged,  # --rescore: samples whose replay gave other results
        "batch_size": config.batch_size,
        "total_batches": counts["total_batches"],
        "duration_seconds": state.duration_seconds,  # every invocation's, summed
        "completed_at": completed_at,
        "retries": state.retries,
        "tool_statistics": totals.tool_statistics,
        "reasoning_statistics": totals.reasoning_statistics,
        "usage": totals.usage,
        **money_statistics(money, totals.cost_known, config.money.max_cost, state.halted == "budget"),
        "errors": errors["types"],
        "error_classes": errors["classes"],  # errors.jsonl lines by failure class (failures.py)
        "max_attempts": config.max_attempts,
        # samples a resume does not send again: out of tries, or failed at the endpoint for good (--retry_failed)
        "exhausted": sum(reason == EXHAUSTED for reason in final.held.values()),
        "endpoint_failed": sum(reason == ENDPOINT for reason in final.held.values()),
        "redactions": totals.redactions,
        "verification": totals.verification | {"skipped_after_pass": final.skipped},
        "token_ids": totals.tokens.statistics(),
        "concurrency": concurrency_statistics(concurrency, config.money),
    }


def exit_code(
    interrupted: bool, stopped: str | None, halted: str | None, remaining: int, retryable: int
) -> tuple[int, str]:
    """The exit status of a run and why: 130 interrupted; 1 the endpoint refused the key or account;
    2 a cost limit without a cost, or --token_ids=required without token ids; 3 the budget is spent;
    1 entries without a final outcome that a resume would send (`retryable` of the `remaining`); 4 entries
    without one, none of which a resume would send (out of --max_attempts, or failed at the endpoint for good);
    else 0."""
    if interrupted:
        return 130, "interrupted"
    if stopped:
        return 1, "stopped"
    if halted == "cost_unknown":
        return 2, "cost_unknown"
    if halted == TokensMissing.reason:  # --token_ids=required
        return 2, "token_ids"
    if halted == "budget":
        return 3, "budget"
    if remaining:
        return (1, "remaining") if retryable else (4, EXHAUSTED)
    return 0, ""


def given_up(console: Console, stats: dict, max_attempts: int) -> dict[str, str]:
    """Exit 4: the one line that says how many samples a resume would not send and why; returns the
    flags that make a resume send them (the caller prints the command)."""
    exhausted, refused = stats["exhausted"], stats["endpoint_failed"]
    said, changes = [], {}
    if exhausted:
        said.append(f"{exhausted} sample(s) exhausted their {max_attempts} attempts (--max_attempts)")
        changes["max_attempts"] = str(max_attempts + 1)
    if refused:
        said.append(f"{refused} sample(s) failed at the endpoint for good (class endpoint: a 400 stays a 400)")
        changes["retry_failed"] = ENDPOINT
    console.print(f"[yellow]Done:[/] {'; '.join(said)}; --resume sends none of them again. To try them once more:")
    return changes


_ENDINGS = {  # why -> what is printed before the command that goes on
    "interrupted": lambda state: "[red]Interrupted.[/] Finished prompts are saved; rerun with --resume to go on:",
    "stopped": lambda state: (
        f"[red]Stopped:[/] {escape(state.stopped)}. Fix the key or account, then rerun with --resume:"
    ),
    "cost_unknown": lambda state: (
        "[red]Stopped:[/] a cost limit needs the cost of every call, but "
        f"{escape(state.halt_message or 'a reply came without one')}. {UNPRICED}"
    ),
    "token_ids": lambda state: f"[red]Stopped:[/] --token_ids=required, but {escape(state.halt_message)}.",
    "remaining": lambda state: "Some entries have no final outcome yet; rerun with --resume to retry them:",
}


def check_endpoint(config: RunConfig) -> None:
    """Before any worker starts: UsageError (exit 2) when the endpoint does not answer at all, rather
    than every prompt retrying for minutes and failing the same way, or lists models without --model."""
    problem, served = endpoint_problem(config.model)
    if problem:
        raise UsageError(
            f"--base_url {config.model.base_url} cannot be reached: {problem}. No prompt was sent; check that "
            "the server runs and the URL is right, then run the same command again."
        )
    wrong = model_problem(config.model.model, served)
    if wrong:
        raise UsageError(f"{wrong} (a --resume of a run with no finished prompt may change it).")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
