"""What the user sees: a progress bar on a terminal, plain periodic lines in cron logs, the summary."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from trajectory import EXIT_CODE_TOOLS
from trajforge.events import PromptDone, PromptEnded, PromptFailed, Retrying, RunRefused, SampleSkipped
from trajforge.money.concurrency import Concurrency
from trajforge.money.report import PRICE_HINT, next_budget, projected, spent, usd
from trajforge.money.store import SpendingTotals
from trajforge.runfolder.merge import dropped

PLAIN_EVERY = 10.0  # seconds between progress lines when stdout is not a terminal
FIRST_MESSAGE_CHARS = 600  # of the first message of an error type, printed as it happens


@dataclass
class Tally:
    """This invocation's prompts (samples, with --n_samples), counted once for the progress line and the
    summary alike."""

    planned: int = 0
    unit: str = "prompts"  # what is counted: with --n_samples, samples
    ended: int = 0
    failed: int = 0
    discarded: int = 0  # by the merge's rule: what will not be in trajectories.jsonl
    retries: int = 0  # model-call attempts tried again
    skipped: int = 0  # samples not started: their entry had --stop_after_passes passes
    verified: int = 0
    passed: int = 0
    seconds: float = 0.0  # this invocation's wall time (statistics.json sums every invocation's)

    def verification(self) -> str:
        """The pass rate so far (and the samples skipped after passes), or nothing when none was verified."""
        if not self.verified:
            return ""
        text = f"passed {self.passed}/{self.verified} ({self.passed / self.verified:.0%})"
        return text + (f", skipped {self.skipped}" if self.skipped else "")


class ProgressView:
    def __init__(self, console: Console, tally: Tally, require_reasoning: bool, money: SpendingTotals):
        self.console = console
        self.tally = tally
        self.require_reasoning = require_reasoning
        self.shown: set[str] = set()  # error types whose first message was printed
        self.spent_before = money.spent  # what earlier invocations paid: the projection is about this one
        self.totals = money
        self.limit: Concurrency | None = None  # the endpoint's adaptive concurrency limit, once it has one
        self.started = self.last_line = time.monotonic()
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn(f"[bold]{tally.unit}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(
                    "failed [red]{task.fields[failed]}[/] discarded [yellow]{task.fields[discarded]}[/] "
                    "retries {task.fields[retries]}"
                ),
                TextColumn("{task.fields[verified]}"),
                TextColumn("{task.fields[rate]}/s"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[money]}"),
                console=console,
            )
            fields: dict[str, Any] = {
                "failed": 0,
                "discarded": 0,
                "retries": 0,
                "verified": "",
                "rate": "0.0",
                "money": "",
                "limit": "",
            }
            self.task = self.bar.add_task(tally.unit, total=tally.planned, **fields)

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
        """Count one sample that ended: done (discarded when the merge will leave it out; a verified one
        counts towards the pass rate), failed, refused, or skipped after its entry's passes; the first
        failure of each error type is printed as it happens."""
        tally = self.tally
        tally.ended += 1
        match event:
            case PromptDone(outcome=outcome, passed=passed):
                tally.discarded += dropped(outcome, self.require_reasoning)
                tally.verified += passed is not None
                tally.passed += bool(passed)
            case SampleSkipped():
                tally.skipped += 1
            case PromptFailed(error=error):
                tally.failed += 1
                self._first(error.error_type, f"prompt {event.index} failed: {error.message}")
            case RunRefused(reason=reason):
                tally.failed += 1
                self._first("api_refused", f"prompt {event.index}: {reason}")
        self.tick()

    def retrying(self, event: Retrying) -> None:
        """A model call will be tried again: counted, and the first of each error type printed."""
        self.tally.retries += 1
        self._first(event.error_type, f"prompt {event.index}, retrying: {event.message}")
        self.tick()

    def _first(self, error_type: str, text: str) -> None:
        if error_type not in self.shown:
            self.shown.add(error_type)
            cut = text[:FIRST_MESSAGE_CHARS] + ("…" if len(text) > FIRST_MESSAGE_CHARS else "")
            self.log(f"{error_type}: {cut}")

    def money(self, totals: SpendingTotals, limit: Concurrency | None) -> None:
        self.totals = totals
        self.limit = limit

    def _limit_text(self) -> str:
        """`concurrency 5/50`: requests in flight allowed now, of --num_workers x --concurrency."""
        return f"concurrency {self.limit.now}/{self.limit.start}" if self.limit and self.limit.adaptive else ""

    def _money_text(self) -> str:
        """Spent so far in the run folder and the projected total, e.g. `$0.42 spent, ~$1.30 total`."""
        paid = spent(self.totals)
        if paid is None:
            return "cost unknown"
        guess = projected(self.spent_before, paid, self.tally.ended, self.tally.planned)
        return f"${paid:.4f} spent" + (f", ~${guess:.4f} total" if guess is not None else "")

    def tick(self) -> None:
        tally = self.tally
        rate = tally.ended / max(time.monotonic() - self.started, 1e-9)
        if self.bar:
            self.bar.update(
                self.task,
                completed=tally.ended,
                failed=tally.failed,
                discarded=tally.discarded,
                retries=tally.retries,
                verified=tally.verification(),
                rate=f"{rate:.1f}",
                money=self._money_text(),
                limit=self._limit_text(),
            )
        elif time.monotonic() - self.last_line >= PLAIN_EVERY:
            self._line()

    def _line(self) -> None:
        self.last_line = time.monotonic()
        line = progress_line(self.tally, self.last_line - self.started, self._money_text(), self._limit_text())
        self.log(f"[{time.strftime('%H:%M:%S')}] {line}")


def progress_line(tally: Tally, elapsed: float, money: str = "", limit: str = "") -> str:
    """`3/10 prompts ended, 1 failed, 0 discarded, 2 retries, passed 2/3 (67%), 0.5/s, ETA 14s, $0.42
    spent, ~$1.30 total, concurrency 5/50`; the ETA is `unknown` until a prompt has ended (never a nan)."""
    rate = tally.ended / elapsed if elapsed > 0 else 0.0
    eta = f"{(tally.planned - tally.ended) / rate:.0f}s" if rate > 0 else "unknown"
    verification = tally.verification()
    return (
        f"{tally.ended}/{tally.planned} {tally.unit} ended, {tally.failed} failed, {tally.discarded} discarded, "
        f"{tally.retries} retries, "
        + (f"{verification}, " if verification else "")
        + f"{rate:.1f}/s, ETA {eta}"
        + (f", {money}" if money else "")
        + (f", {limit}" if limit else "")
    )


def summary_json(stats: dict, code: int, why: str, command: str, paths: dict) -> str:
    """--summary_json: the summary as one line of JSON: statistics.json's fields, the exit status and
    why ("" when 0), the command that goes on ("" when none) and the files written."""
    files = {label.lower().replace(" ", "_"): str(path) for label, path in paths.items()}
    ending = {"exit_status": code, "exit_cause": why, "continue_command": command, "files": files}
    return json.dumps(stats | ending, ensure_ascii=False)


def print_summary(console: Console, stats: dict, tally: Tally, paths: dict) -> None:
    console.rule(f"[bold]Run {stats['run_name']}")
    skipped = f", {tally.skipped} skipped after passes" if tally.skipped else ""
    console.print(
        f"This invocation: {tally.ended} of {tally.planned} planned {tally.unit} ended ({tally.failed} failed, "
        f"{tally.discarded} discarded, {tally.retries} retries{skipped}), in {tally.seconds:.1f}s (the run so far: "
        f"{stats['duration_seconds']:.1f}s); commands ran in --environment={stats['environment']}"
    )
    console.print(
        f"Run folder: {stats['trajectories']} trajectories written ({stats['completed']} completed, "
        f"{stats['partial']} partial); discarded: {stats['discarded_no_reasoning']} without reasoning, "
        f"{stats['discarded_hallucinated_tools']} with hallucinated tools; {stats['failed']} failed; "
        f"{stats['remaining']} of {stats['total_prompts']} dataset entries still to do"
    )
    table = Table(title="Tool usage (failure: the tool itself failed; nonzero exit: the command or program it ran did)")
    for column in ("tool", "calls", "success", "failure", "nonzero exit", "success rate"):
        table.add_column(column, justify="left" if column == "tool" else "right")
    for name, entry in stats["tool_statistics"].items():
        if entry["count"]:
            exits = str(entry.get("nonzero_exits", 0)) if name in EXIT_CODE_TOOLS else "-"
            numbers = [str(entry[key]) for key in ("count", "success", "failure")]
            table.add_row(name, *numbers, exits, f"{entry['success_rate']:.0%}")
    console.print(table if table.row_count else "Tool usage: no tool calls")
    reasoning = stats["reasoning_statistics"]
    console.print(
        f"Reasoning coverage: {reasoning['coverage']:.1%} of {reasoning['total_assistant_turns']} assistant turns "
        f"({reasoning['turns_without_reasoning']} without reasoning)"
    )
    verification = stats.get("verification") or {}
    if verification.get("verified_samples"):
        skipped = verification["skipped_after_pass"]
        console.print(
            f"Verification: {verification['passed']}/{verification['verified_samples']} samples passed "
            f"({verification['passed'] / verification['verified_samples']:.0%}, {verification['errors']} verifier "
            f"errors), mean reward {verification['mean_reward']:.3f}; pass@1 {verification['pass_at_1']:.1%}, "
            f"pass@k {verification['pass_at_k']:.1%}; {verification['preference_pairs']} preference pairs"
            + (f"; {skipped} samples skipped after passes" if skipped else "")
        )
    usage = stats["usage"]
    if usage.get("total_tokens"):
        line = (
            f"Tokens: {usage.get('prompt_tokens', 0):,} prompt ({usage.get('cached_tokens', 0):,} cached), "
            f"{usage.get('completion_tokens', 0):,} completion ({usage.get('reasoning_tokens', 0):,} reasoning), "
            f"{usage['total_tokens']:,} total"
        )
        known = stats.get("cost_known", True) and usage.get("cost") is not None
        cost = f"cost ${usage['cost']:.4f}" if known else f"cost unknown (the endpoint reported none): {PRICE_HINT}"
        console.print(f"{line}; {cost}")
    _print_money(console, stats)
    masked = {kind: count for kind, count in stats.get("redactions", {}).items() if count}
    if masked:  # the model quoted what it must not, or a command found a key: worth a look
        console.print(
            "Secrets masked in saved output: " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in masked.items())
        )
    for label, path in paths.items():
        console.print(f"{label}: {path}")
    if not stats["trajectories"] and stats["discarded_no_reasoning"]:
        console.print(
            f"[yellow]No trajectory was kept:[/] {stats['discarded_no_reasoning']} sample(s) had no reasoning. Keep "
            "them without calling the model again: rerun with --resume --require_reasoning=False."
        )
    if stats["failed"]:
        classes = ", ".join(f"{kind} {count}" for kind, count in stats["error_classes"].items() if count)
        console.print(f"[red]{stats['failed']} prompt(s) failed[/] (see errors.jsonl; its lines by class: {classes}).")
    if stats["exhausted"] or stats["endpoint_failed"]:
        console.print(
            f"Not sent again by --resume: {stats['exhausted']} sample(s) exhausted (--max_attempts="
            f"{stats['max_attempts']}), {stats['endpoint_failed']} failed at the endpoint for good (a 400 stays a 400)."
        )


def _print_money(console: Console, stats: dict) -> None:
    cache, budget = stats.get("cache") or {}, stats.get("budget") or {}
    if cache.get("hits"):
        console.print(
            f"Response cache: {cache['hits']} calls answered from it (saving ${cache['saved_cost']:.4f}), "
            f"{cache['misses']} paid"
        )
    if budget.get("max_cost") is not None and budget.get("spent") is not None:
        console.print(f"Budget: {usd(budget['spent'])} spent of {usd(budget['max_cost'])} (--max_cost)")


def print_budget_stop(
    console: Console, stats: dict, totals: SpendingTotals, spent_before: float, tally: Tally
) -> float:
    """The run stopped at its budget: what was spent of what, what remains; returns the budget that
    lets it go on (the caller prints the command)."""
    paid, budget = spent(totals) or 0.0, stats["budget"]["max_cost"]
    finished = stats["total_prompts"] - stats["remaining"]
    guess = projected(spent_before, paid, tally.ended, tally.planned)
    more = next_budget(paid, budget, finished, stats["total_prompts"], guess)
    console.print(
        f"[yellow]Budget reached:[/] {usd(paid)} spent of {usd(budget)} (--max_cost), this invocation "
        f"{usd(paid - spent_before)}; {stats['remaining']} of {stats['total_prompts']} dataset entries remain. "
        "Prompts stopped on the way are not saved; their paid calls are answered from the response cache. "
        f"To continue with a budget of {usd(more)}:"
    )
    return more
