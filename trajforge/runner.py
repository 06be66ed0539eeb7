"""One run: check the dataset, plan what is left, run it on the executor, merge, and summarise."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from urllib.parse import urlsplit

from rich.console import Console
from rich.markup import escape

from toolset_distributions import DISTRIBUTIONS, usable
from trajforge.config import RunConfig
from trajforge.dataset import Entry, UsageError, load_dataset
from trajforge.environments import SetupError, choose, prepare_run, remove_leftovers
from trajforge.events import LogLine, PromptDone, PromptEnded, PromptError, PromptFailed, RunRefused
from trajforge.executors.pool import ProcessPool
from trajforge.executors.ray_pool import RayPool
from trajforge.executors.worker import Batch, WorkerSetup
from trajforge.progress import ProgressView, print_summary
from trajforge.runfolder.folder import RunFolder, entry_key, write_json_atomic
from trajforge.runfolder.merge import merge
from trajforge.runfolder.state import RunState
from trajforge.secrets import conceal
from trajforge.tools import registry
from trajforge.tools.browser_runtime import BrowserUnavailable
from trajforge.tools.browser_service import browser_service

CHECKPOINT_EVERY = 1.0  # seconds; batch files, not the checkpoint, are the record of what is done


@contextmanager
def mock_endpoint(config: RunConfig):
    """For --model=mock: the scripted OpenAI-compatible server, on 127.0.0.1, for this run only."""
    if not config.mock:
        yield config
        return
    server = subprocess.Popen(
        [sys.executable, "-m", "trajforge.mock.server", "--port", "0", "--exit_with_stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline().strip()
        if not line.startswith("MOCK_SERVER_URL="):
            raise RuntimeError(f"the mock server did not start (it printed {line!r})")
        url = line.split("=", 1)[1]
        # The mock model sends its tools to its own pages: the one loopback origin URL checks let through.
        tools = replace(config.tools, trusted_origins=frozenset({urlsplit(url).netloc}))
        yield replace(config, model=replace(config.model, base_url=url), tools=tools)
    finally:
        server.kill()
        server.wait()


@contextmanager
def helpers(config: RunConfig, browser: bool):
    """The run's helper processes, started side by side: the mock server (--model=mock) and, when the
    distribution has the browser, one browser service for all local workers (browser_service.py)."""
    if not browser or config.executor != "pool":  # Ray tasks may run on other machines: each has its own
        with mock_endpoint(config) as live:
            yield live
        return
    with browser_service(config.tools.browser_executable) as service, mock_endpoint(config) as live:
        try:
            address = service.ready(live.tools)
        except BrowserUnavailable as exc:  # raised only by the start: the body runs no browser code
            raise SetupError(f"the browser toolset: {exc}") from None
        yield replace(live, tools=replace(live.tools, browser_endpoint=address))


def match(entries: list[Entry], finished: Counter) -> tuple[list[Entry], list[int]]:
    """Subtract the finished entry keys from the dataset, counting duplicates one by one."""
    finished = Counter(finished)
    pending, done = [], []
    for entry in entries:
        key = entry_key(entry.data)
        if finished[key]:
            finished[key] -= 1
            done.append(entry.index)
        else:
            pending.append(entry)
    return pending, done


class BatchRunner:
    def __init__(self, config: RunConfig, console: Console):
        self.config = config
        self.console = console
        self.folder = RunFolder(config.run_dir)
        self.warned: set[str] = set()

    def warn(self, text: str) -> None:
        if text not in self.warned:
            self.warned.add(text)
            self.console.print(f"[yellow]warning:[/] {escape(text)}")

    # -- planning ------------------------------------------------------------------------------
    def plan(self, entries: list[Entry]) -> tuple[list[Entry], list[int]]:
        """(entries still to run, indices already done), matched by content with multiplicity."""
        if not self.config.resume:
            if self.folder.has_run():
                raise UsageError(
                    f"--run_name: {self.folder.path} already holds a run; pass --resume to continue it "
                    "or choose another --run_name"
                )
            return entries, []
        return match(
            entries, Counter(entry_key(r["metadata"]["source"]) for _, r in self.folder.batch_lines(self.warn))
        )

    # -- running -------------------------------------------------------------------------------
    def run(self) -> int:
        started = time.time()
        environment, unsandboxed = choose(self.config.environment)  # what workers use and statistics record
        self.config = config = replace(self.config, environment=environment)
        if unsandboxed:
            self.warn(unsandboxed)
        # Before any worker forks or any helper starts: none of them inherits a secret it could show.
        conceal(config.secrets.texts)
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
            return self._run_locked(entries, weights, toolsets, started)

    def _run_locked(self, entries: list[Entry], weights: dict, toolsets: dict, started: float) -> int:
        config = self.config
        pending, done = self.plan(entries)
        self.folder.remove_leftovers()
        first = self.folder.next_batch_num()
        size = config.batch_size
        batches = [
            Batch(first + i, [(e.index, e.data) for e in pending[start : start + size]])
            for i, start in enumerate(range(0, len(pending), size))
        ]
        if config.resume:
            self.console.print(f"Resuming {config.run_name}: {len(done)} prompts already done, {len(pending)} to run")
        tool_names = sorted(registry.TOOLS)
        by_index = {e.index: e.data for e in entries}
        state = RunState(self.folder, config.run_name, str(config.dataset_file), by_index, done)
        interrupted = False
        if batches:
            prepare_run(config.environment, config.resume)
            with helpers(config, "browser" in weights) as live:
                setup = WorkerSetup(live, weights, toolsets, tool_names)
                interrupted = self.execute(setup, batches, state)
        totals = merge(self.folder, config.require_reasoning, tool_names, self.warn)
        # The batch files, not the events that raced a kill or Ctrl-C, say what is done.
        remaining, done = match(entries, totals.finished)
        error_counts, failed_before = self.folder.error_summary()
        state.settle(done, [e.index for e in remaining if entry_key(e.data) in failed_before])
        stats = {
            "run_name": config.run_name,
            "model": config.model.model,
            "distribution": config.distribution,
            "environment": config.environment.kind,
            "dataset_file": str(config.dataset_file),
            "total_prompts": len(entries),
            "completed": totals.completed,
            "partial": totals.partial,
            "failed": len(state.failed),
            "remaining": len(remaining),  # entries without a final outcome: failed or never reached
            "discarded_no_reasoning": totals.discarded_no_reasoning,
            "discarded_hallucinated_tools": totals.discarded_hallucinated_tools,
            "trajectories": totals.trajectories,
            "batch_size": config.batch_size,
            "total_batches": len(self.folder.batch_files()),
            "duration_seconds": round(time.time() - started, 3),
            "completed_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "retries": state.retries,
            "tool_statistics": totals.tool_statistics,
            "reasoning_statistics": totals.reasoning_statistics,
            "usage": totals.usage,
            "errors": error_counts,
            "redactions": totals.redactions,
        }
        write_json_atomic(self.folder.statistics, stats)
        paths = {"Trajectories": self.folder.trajectories, "Statistics": self.folder.statistics}
        counts = {"planned": len(pending), "ended": state.ended, "failed": len(state.failed)}
        print_summary(self.console, stats, counts, paths)
        if interrupted:
            self.console.print("[red]Interrupted.[/] Finished prompts are saved; rerun with --resume to go on.")
            return 130
        if state.stopped:
            self.console.print(
                f"[red]Stopped:[/] {escape(state.stopped)}. Fix the key or account, then rerun with --resume."
            )
            return 1
        return 1 if remaining else 0

    def execute(self, setup: WorkerSetup, batches: list[Batch], state: RunState) -> bool:
        """Run the batches on the executor and follow its events; returns True when interrupted."""
        config = self.config
        if config.executor == "ray":
            executor = RayPool(setup, config.num_workers, config.ray_address, config.ray_shared_fs)
        else:
            executor = ProcessPool(setup, config.num_workers)
        outstanding = {index for batch in batches for index, _ in batch.entries}
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            executor.start(batches)
            with ProgressView(self.console, len(outstanding)) as view:

                def ended(event: PromptEnded) -> None:
                    outstanding.discard(event.index)
                    state.record(event)
                    view.update(event)

                while outstanding and not state.stopped:
                    events = executor.poll(0.5)
                    for event in events:
                        match event:
                            case LogLine(text=text):
                                view.log(text)
                            case PromptDone() | PromptFailed() | RunRefused():
                                ended(event)
                    if not events:
                        for index, reason in sorted(executor.lost(outstanding).items()):
                            ended(PromptFailed(index, None, PromptError("worker_died", reason, 1)))
                    view.tick()
                    state.save_every(CHECKPOINT_EVERY)
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


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
