"""--dry_run: a run's checks without the run. The flags, the dataset and its tasks' paths, the plan of
a resume and the endpoint (its GET /models) are checked as a run checks them; then what the run would do
is printed: the samples, the most chat requests they can make and, with prices, the most their completions
can cost. No chat request is sent and nothing is written to the run folder."""

from __future__ import annotations

from rich.console import Console

from trajforge.money.pricing import PER_TOKEN
from trajforge.run.samples import Plan
from trajforge.runconfig import RunConfig


def bounds(config: RunConfig, plan: Plan) -> list[str]:
    """What the run would do, as lines: samples, at most how many chat requests, at most what cost."""
    samples = len(plan.pending)
    requests = samples * config.max_turns
    lines = [
        f"Dry run of {config.run_name}: every check passed; no chat request was sent.",
        f"Samples to run: {samples} ({len({entry.index for entry, _ in plan.pending})} dataset entries"
        + (f", {len(plan.done)} already done" if config.resume else "")
        + (f", {len(plan.held)} held back: out of tries or refused for good)" if plan.held else ")"),
        f"Chat requests: at most {requests} (--max_turns={config.max_turns} x {samples} samples), each retried at "
        f"most --max_retries={config.model.max_retries} times on errors",
    ]
    prices, max_tokens = config.model.prices, config.model.max_tokens
    if prices is None:
        lines.append("Cost: no bound known (pass --price_input and --price_output, USD per million tokens)")
    elif max_tokens is None:
        lines.append("Cost: no bound known (pass --max_tokens: a completion is not bounded without it)")
    else:
        tokens = requests * max_tokens
        lines.append(
            f"Completion tokens: at most {tokens:,} (--max_tokens={max_tokens} per request), at most "
            f"${tokens * prices.output * PER_TOKEN:.4f} at --price_output; prompt tokens grow with each turn "
            "and are not bounded here"
        )
    if config.money.max_cost is not None:
        lines.append(f"Budget: --max_cost=${config.money.max_cost:.2f} stops the run there, whatever the bounds")
    return lines


def dry_run(console: Console, config: RunConfig, plan: Plan) -> int:
    """Print what the run would do (after the runner's checks); the exit status, 0."""
    for line in bounds(config, plan):
        console.print(line, markup=False, highlight=False)
    return 0
