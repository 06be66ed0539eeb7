"""A plugin as a user writes one, outside the package: a toolset, a distribution, an export format and a
verifier kind, registered through `register(registry)` (docs/internals.md, "How to add ...")."""

from __future__ import annotations

import json


async def lookup_order(session, order_id: str) -> dict:
    """Look up an order by its id.

    Args:
        order_id: the order's id, as the customer wrote it
    """
    if order_id == "boom":
        raise RuntimeError("the order service is down")
    return {"order_id": order_id, "status": "shipped"}


async def cancel_order(session, order_id: str, reason: str | None = None) -> dict:
    """Cancel an order that has not shipped.

    Args:
        order_id: the order's id
        reason: why, in the customer's words
    """
    return {"order_id": order_id, "status": "cancelled"}


class OrderLines:
    """export/orders.jsonl: a line per trajectory, the prompt and the tools it called."""

    def __init__(self, path, run):
        self.path, self.rows = path, []

    def write(self, row: dict) -> None:
        self.rows.append(row)

    def commit(self) -> None:
        self.path.write_text("".join(json.dumps(row) + "\n" for row in self.rows))

    def abort(self) -> None:
        self.rows = []


def order_row(sample, run) -> dict:
    called = [call.name for turn in sample.turns for call in turn.calls]
    return {"run": run.run_name, "prompt": sample.prompt, "called": called}


def mentions(text, context):
    """Passes when the final answer mentions `text`; a quarter of the reward otherwise."""
    from trajforge.registry import Verdict

    found = text in context.final_answer
    return Verdict(found, f"looked for {text!r} in the final answer", 1.0 if found else 0.25)


def mentions_problem(value) -> str | None:
    return None if isinstance(value, str) and value else '"verify.mentions" must be a non-empty string'


def register(registry) -> None:
    registry.toolset("orders", [lookup_order, cancel_order])
    registry.distribution("support", {"orders": 100})
    registry.export("order_lines", "orders.jsonl", OrderLines, order_row)
    registry.verifier("mentions", mentions, mentions_problem)
