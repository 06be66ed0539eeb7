"""--dry_run: a run's checks without the run. The flags, the dataset and its tasks' paths, the plan of
a resume and the endpoint (its GET /models) are checked as a run checks them; then what the run would do
is printed: the samples, the most chat requests they can make and, with prices, the most their completions
can cost. No chat request is sent and nothing is written to the run folder."""

from __future__ import annotations

import json

from rich.console import Console

from trajforge.money.pricing import PER_TOKEN
from trajforge.run.samples import Plan
from trajforge.runconfig import RunConfig


def bounds(config: RunConfig, plan: Plan) -> dict:
    """What the run would do: samples to run, at most how many chat requests and completion tokens, at most
    what those cost (None where no bound is known)."""
    samples = len(plan.pending)
    requests = samples * config.max_turns
    prices, max_tokens = config.model.prices, config.model.max_tokens
    tokens = None if max_tokens is None else requests * max_tokens
    return {
        "dry_run": True,
        "samples": samples,
        "entries": len({entry.index for entry, _ in plan.pending}),
        "done": len(plan.done),
        "held_back": len(plan.held),
        "max_requests": requests,
        "max_completion_tokens": tokens,
        "max_completion_cost": None if tokens is None or prices is None else tokens * prices.output * PER_TOKEN,
    }


def lines(config: RunConfig, found: dict) -> list[str]:
    """The bounds as people read them."""
    samples, tokens, cost = found["samples"], found["max_completion_tokens"], found["max_completion_cost"]
    said = [
        f"Dry run of {config.run_name}: every check passed; no chat request was sent.",
        f"Samples to run: {samples} ({found['entries']} dataset entries"
        + (f", {found['done']} already done" if config.resume else "")
        + (f", {found['held_back']} held back: out of tries or refused for good)" if found["held_back"] else ")"),
        f"Chat requests: at most {found['max_requests']} (--max_turns={config.max_turns} x {samples} samples), "
        f"each retried at most --max_retries={config.model.max_retries} times on errors",
    ]
    if config.model.prices is None:
        said.append("Cost: no bound known (pass --price_input and --price_output, USD per million tokens)")
    elif tokens is None:
        said.append("Cost: no bound known (pass --max_tokens: a completion is not bounded without it)")
    else:
        said.append(
            f"Completion tokens: at most {tokens:,} (--max_tokens={config.model.max_tokens} per request), at most "
            f"${cost:.4f} at --price_output; prompt tokens grow with each turn and are not bounded here"
        )
    if config.money.max_cost is not None:
        said.append(f"Budget: --max_cost=${config.money.max_cost:.2f} stops the run there, whatever the bounds")
    return said


def dry_run(console: Console, config: RunConfig, plan: Plan) -> int:
    """Print what the run would do (after the runner's checks), also as JSON with --summary_json; exit 0."""
    found = bounds(config, plan)
    for line in lines(config, found):
        console.print(line, markup=False, highlight=False)
    if config.summary_json:  # the console went to stderr
        print(json.dumps(found), flush=True)
    return 0
