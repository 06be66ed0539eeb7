"""What the user sees: a progress bar on a terminal, plain periodic lines in cron logs, the summary."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from trajforge.events import PromptDone, PromptEnded, SampleSkipped

PLAIN_EVERY = 10.0  # seconds between progress lines when stdout is not a terminal


class ProgressView:
    def __init__(self, console: Console, total: int, samples: bool = False):
        self.console = console
        self.total = total
        self.unit = "samples" if samples else "prompts"  # what is counted: with --n_samples, samples
        self.done = self.failed = self.discarded = self.skipped = self.verified = self.passed = 0
        self.started = self.last_line = time.monotonic()
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn(f"[bold]{self.unit}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("failed [red]{task.fields[failed]}[/] discarded [yellow]{task.fields[discarded]}[/]"),
                TextColumn("{task.fields[verified]}"),
                TextColumn("{task.fields[rate]}/s"),
                TimeRemainingColumn(),
                console=console,
            )
            self.task = self.bar.add_task(self.unit, total=total, failed=0, discarded=0, verified="", rate="0.0")

    def __enter__(self) -> ProgressView:
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar:
            self.bar.stop()
        else:
            self._line()

    def log(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def update(self, event: PromptEnded | SampleSkipped) -> None:
        """Count one sample that ended: done (a discard reason counts as discarded; a verified one
        counts towards the pass rate), failed, refused, or skipped after its entry's passes."""
        self.done += 1
        match event:
            case PromptDone(outcome=outcome, passed=passed):
                self.discarded += outcome in ("no_reasoning", "hallucinated_tool")
                self.verified += passed is not None
                self.passed += bool(passed)
            case SampleSkipped():
                self.skipped += 1
            case _:
                self.failed += 1
        self.tick()

    def verification(self) -> str:
        """The pass rate so far (and the samples skipped after passes), or nothing when none was verified."""
        if not self.verified:
            return ""
        text = f"passed {self.passed}/{self.verified} ({self.passed / self.verified:.0%})"
        return text + (f", skipped {self.skipped}" if self.skipped else "")

    def tick(self) -> None:
        rate = self.done / max(time.monotonic() - self.started, 1e-9)
        if self.bar:
            self.bar.update(
                self.task,
                completed=self.done,
                failed=self.failed,
                discarded=self.discarded,
                verified=self.verification(),
                rate=f"{rate:.1f}",
            )
        elif time.monotonic() - self.last_line >= PLAIN_EVERY:
            self._line()

    def _line(self) -> None:
        self.last_line = now = time.monotonic()
        rate = self.done / max(now - self.started, 1e-9)
        eta = (self.total - self.done) / rate if rate else float("nan")
        verification = self.verification()
        self.log(
            f"[{time.strftime('%H:%M:%S')}] {self.done}/{self.total} {self.unit} ended, {self.failed} failed, "
            f"{self.discarded} discarded, " + (f"{verification}, " if verification else "") + f"{rate:.1f}/s, "
            f"ETA {eta:.0f}s"
        )


def print_summary(console: Console, stats: dict, run_counts: dict, paths: dict) -> None:
    console.rule(f"[bold]Run {stats['run_name']}")
    unit = "samples" if stats.get("n_samples", 1) > 1 else "prompts"
    skipped = f", {run_counts['skipped']} skipped after passes" if run_counts.get("skipped") else ""
    console.print(
        f"This invocation: {run_counts['ended']} {unit} ended ({run_counts['failed']} failed{skipped}) "
        f"of {run_counts['planned']} planned, in {stats['duration_seconds']:.1f}s; commands ran in "
        f"--environment={stats['environment']}"
    )
    console.print(
        f"Run folder: {stats['trajectories']} trajectories written ({stats['completed']} completed, "
        f"{stats['partial']} partial); discarded: {stats['discarded_no_reasoning']} without reasoning, "
        f"{stats['discarded_hallucinated_tools']} with hallucinated tools; {stats['failed']} failed; "
        f"{stats['remaining']} of {stats['total_prompts']} dataset entries still to do"
    )
    table = Table(title="Tool usage")
    for column in ("tool", "calls", "success", "failure", "success rate"):
        table.add_column(column, justify="left" if column == "tool" else "right")
    for name, entry in stats["tool_statistics"].items():
        if entry["count"]:
            table.add_row(
                name, str(entry["count"]), str(entry["success"]), str(entry["failure"]), f"{entry['success_rate']:.0%}"
            )
    console.print(table if table.row_count else "Tool usage: no tool calls")
    reasoning = stats["reasoning_statistics"]
    console.print(
        f"Reasoning coverage: {reasoning['coverage']:.1%} of {reasoning['total_assistant_turns']} assistant turns "
        f"({reasoning['turns_without_reasoning']} without reasoning)"
    )
    verification = stats.get("verification") or {}
    if verification.get("verified_samples"):
        console.print(
            f"Verification: {verification['passed']}/{verification['verified_samples']} samples passed "
            f"({verification['passed'] / verification['verified_samples']:.0%}, {verification['errors']} verifier "
            f"errors), mean reward {verification['mean_reward']:.3f}; pass@1 {verification['pass_at_1']:.1%}, "
            f"pass@k {verification['pass_at_k']:.1%}; {verification['preference_pairs']} preference pairs"
            + (
                f"; {verification['skipped_after_pass']} samples skipped after passes"
                if verification["skipped_after_pass"]
                else ""
            )
        )
    usage = stats["usage"]
    if usage.get("total_tokens"):
        line = (
            f"Tokens: {usage.get('prompt_tokens', 0):,} prompt, {usage.get('completion_tokens', 0):,} completion "
            f"({usage.get('reasoning_tokens', 0):,} reasoning), {usage['total_tokens']:,} total"
        )
        console.print(line + (f"; cost ${usage['cost']:.4f}" if usage.get("cost") else ""))
    masked = {kind: count for kind, count in stats.get("redactions", {}).items() if count}
    if masked:  # the model quoted what it must not, or a command found a key: worth a look
        console.print(
            "Secrets masked in saved output: " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in masked.items())
        )
    for label, path in paths.items():
        console.print(f"{label}: {path}")
    if stats["failed"]:
        console.print(
            f"[red]{stats['failed']} prompt(s) failed[/] (see errors.jsonl); rerun the same command with --resume "
            "to retry them."
        )
