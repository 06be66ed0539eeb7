"""What the user sees: a progress bar on a terminal, plain periodic lines in cron logs, the summary."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from trajforge.events import PromptDone, PromptEnded
from trajforge.money.report import PRICE_HINT, continue_command, next_budget, projected, spent, usd
from trajforge.money.store import Totals

PLAIN_EVERY = 10.0  # seconds between progress lines when stdout is not a terminal


class ProgressView:
    def __init__(self, console: Console, total: int, money: Totals):
        self.console = console
        self.total = total
        self.spent_before = money.spent  # what earlier invocations paid: the projection is about this one
        self.totals = money
        self.done = self.failed = self.discarded = 0
        self.started = self.last_line = time.monotonic()
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]prompts"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("failed [red]{task.fields[failed]}[/] discarded [yellow]{task.fields[discarded]}[/]"),
                TextColumn("{task.fields[rate]}/s"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[money]}"),
                console=console,
            )
            self.task = self.bar.add_task("prompts", total=total, failed=0, discarded=0, rate="0.0", money="")

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

    def update(self, event: PromptEnded) -> None:
        """Count one prompt that ended: done (a discard reason counts as discarded), failed or refused."""
        self.done += 1
        match event:
            case PromptDone(outcome=outcome):
                self.discarded += outcome in ("no_reasoning", "hallucinated_tool")
            case _:
                self.failed += 1
        self.tick()

    def money(self, totals: Totals) -> None:
        self.totals = totals

    def _money_text(self) -> str:
        """Spent so far in the run folder and the projected total, e.g. `$0.42 spent, ~$1.30 total`."""
        paid = spent(self.totals)
        if paid is None:
            return "cost unknown"
        guess = projected(self.spent_before, paid, self.done, self.total)
        return f"${paid:.4f} spent" + (f", ~${guess:.4f} total" if guess is not None else "")

    def tick(self) -> None:
        rate = self.done / max(time.monotonic() - self.started, 1e-9)
        if self.bar:
            self.bar.update(
                self.task,
                completed=self.done,
                failed=self.failed,
                discarded=self.discarded,
                rate=f"{rate:.1f}",
                money=self._money_text(),
            )
        elif time.monotonic() - self.last_line >= PLAIN_EVERY:
            self._line()

    def _line(self) -> None:
        self.last_line = now = time.monotonic()
        rate = self.done / max(now - self.started, 1e-9)
        eta = (self.total - self.done) / rate if rate else float("nan")
        self.log(
            f"[{time.strftime('%H:%M:%S')}] {self.done}/{self.total} prompts ended, {self.failed} failed, "
            f"{self.discarded} discarded, {rate:.1f}/s, ETA {eta:.0f}s, {self._money_text()}"
        )


def print_summary(console: Console, stats: dict, run_counts: dict, paths: dict) -> None:
    console.rule(f"[bold]Run {stats['run_name']}")
    console.print(
        f"This invocation: {run_counts['ended']} prompts ended ({run_counts['failed']} failed) "
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
    if stats["failed"]:
        console.print(
            f"[red]{stats['failed']} prompt(s) failed[/] (see errors.jsonl); rerun the same command with --resume "
            "to retry them."
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


def print_budget_stop(console: Console, stats: dict, totals: Totals, spent_before: float, argv: list[str]) -> None:
    """The run stopped at its budget: what was spent of what, what remains and how to go on."""
    paid, budget = spent(totals) or 0.0, stats["budget"]["max_cost"]
    finished = stats["total_prompts"] - stats["remaining"]
    more = next_budget(paid, budget, finished, stats["total_prompts"])
    console.print(
        f"[yellow]Budget reached:[/] {usd(paid)} spent of {usd(budget)} (--max_cost), this invocation "
        f"{usd(paid - spent_before)}; {stats['remaining']} of {stats['total_prompts']} dataset entries remain. "
        "Prompts stopped on the way are not saved; their paid calls are answered from the response cache. "
        "To continue:"
    )
    console.print(continue_command(argv, more), markup=False, highlight=False)
