"""A finished sample as a typed object, and its line in a batch file (the journal, version 2).

The worker journals what the session was, not text made from it: the assistant turns with their
content, reasoning, calls and results as fields, the offered tools as schemas, usage, verification,
the exit reason and the dataset entry. The merge renders the ShareGPT record of trajectories.jsonl from
it (`record`, byte for byte what the worker used to write), and the exporters, the report and the
preference pairs read its fields. Lines written before the journal had a version are read by v1.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import orjson

from trajectory import (
    TEXT,
    ToolCall,
    Turn,
    conversations,
    current_usage,
    current_verification,
    turn_of,
)
from trajforge.journal import offered
from trajforge.safejson import dumps

VERSION = 2
# The keys a batch line holds beside the sample, for the merge's totals; never in trajectories.jsonl.
OWN_KEYS = ("discarded", "redactions", "nonzero_exits", "tokens")


@dataclass
class Sample:
    prompt_index: int
    sample_index: int
    batch_num: int
    entry: dict  # the dataset entry as it was
    tools: list[dict]  # the functions offered: {name, description, parameters}
    toolsets: list[str]
    turns: list[Turn]
    api_calls: int
    exit_reason: str  # completed, or the limit or cut-off that ended it (partial)
    usage: dict  # as the record holds it: record_usage(), `cost_known` beside the cost
    verification: dict  # verification.result: unverified() or result(); {} until verified
    tool_stats: dict  # {tool: {count, success, failure}} over every tool the run can offer
    model: str
    model_reported: str
    run_name: str
    duration_seconds: float
    timestamp: str  # ISO 8601, UTC, when the record was built
    token_drift: str  # JSON text of the turns where the template was not append-only
    discarded: str | None = None  # why the merge drops it: no_reasoning, hallucinated_tool
    redactions: dict = field(default_factory=dict)  # secrets masked, by kind
    nonzero_exits: dict = field(default_factory=dict)  # {tool: calls whose command exited non-zero}
    tokens: dict | None = None  # {turns, missing} with --token_ids
    legacy: dict | None = None  # a version-1 line's record (v1.py): its own ShareGPT text, rendered as is
    legacy_line: bytes | None = None  # that line, when the record needs no change to be written
    rendered: dict | None = field(default=None, init=False, repr=False, compare=False)  # record(), made once

    @property
    def prompt(self) -> str:
        return self.entry.get("prompt", "") if self.legacy is None else _legacy_prompt(self.legacy)

    @property
    def system(self) -> str:
        """The system turn's text: the offered tools listed (as the record has it)."""
        if self.legacy is not None:
            return next((t["value"] for t in self.legacy["conversations"] if t.get("from") == "system"), "")
        return offered.system(self.tools)

    @property
    def completed(self) -> bool:
        return self.exit_reason == "completed" if self.legacy is None else bool(self.legacy.get("completed"))

    @property
    def partial(self) -> bool:
        return not self.completed if self.legacy is None else bool(self.legacy.get("partial"))

    @property
    def reward(self) -> float:
        return self.verification["reward"]

    def record(self) -> dict:
        """The ShareGPT trajectory record (trajectories.jsonl), with its keys in the order it always had
        (made once: the merge and the parquet export both need it)."""
        if self.legacy is not None:
            return self.legacy
        if self.rendered is None:
            self.rendered = self._render()
        return self.rendered

    def _render(self) -> dict:
        stats = self.tool_stats
        record: dict[str, Any] = {
            "prompt_index": self.prompt_index,
            "conversations": conversations(self.system, self.prompt, self.turns),
            "metadata": {
                "batch_num": self.batch_num,
                "model": self.model,
                "model_reported": self.model_reported,
                "run_name": self.run_name,
                "duration_seconds": self.duration_seconds,
                "sample_index": self.sample_index,
                "token_drift": self.token_drift,
                "timestamp": self.timestamp,
                "exit_reason": self.exit_reason,
                "usage": self.usage,
                "source": TEXT(self.entry),  # entries of other datasets have other keys
            },
            "completed": self.completed,
            # max_turns, timeout, length, content_filter: a limit or a cut-off is an outcome, not an error
            "partial": self.partial,
            "api_calls": self.api_calls,
            "toolsets_used": self.toolsets,
            "tool_stats": stats,
            "tool_error_counts": {name: entry["failure"] for name, entry in stats.items()},
        }
        if self.verification:  # a Python verifier is handed the record before there is one
            record["metadata"] |= {"verification": self.verification, "reward": self.verification["reward"]}
        return record

    def trajectory_line(self) -> bytes:
        """Its line of trajectories.jsonl."""
        if self.legacy_line is not None:
            return self.legacy_line
        record = self.record()
        system, *turns = record["conversations"]  # the system turn: the record's longest text, encoded once
        return dumps(record | {"conversations": [_encoded(system["value"]), *turns]}, orjson.OPT_APPEND_NEWLINE)

    def journal(self) -> bytes:
        """Its line of a batch file: the version, the sample's fields, the batch file's own keys when set."""
        line: dict[str, Any] = {"version": VERSION}
        for key in JOURNALLED:
            line[key] = [_turn_fields(turn) for turn in self.turns] if key == "turns" else getattr(self, key)
        for key in OWN_KEYS:
            value = getattr(self, key)
            if value:
                line[key] = value
        return dumps(line) + b"\n"  # what orjson cannot encode kept as text


# The fields every journal line has, in the order it writes them (the batch file's own keys follow).
JOURNALLED = (
    "prompt_index",
    "sample_index",
    "batch_num",
    "entry",
    "tools",
    "toolsets",
    "turns",
    "api_calls",
    "exit_reason",
    "usage",
    "verification",
    "tool_stats",
    "model",
    "model_reported",
    "run_name",
    "duration_seconds",
    "timestamp",
    "token_drift",
)


def now() -> str:
    """A record's timestamp."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _turn_fields(turn: Turn) -> dict:
    return {
        "content": turn.content,
        "reasoning": turn.reasoning,
        "finish_reason": turn.finish_reason,
        "calls": [{"id": c.id, "name": c.name, "arguments": c.arguments, "result": c.result} for c in turn.calls],
    }


def from_journal(line: dict) -> Sample:
    """The sample of a version-2 batch line (as orjson read it)."""
    turns = [
        Turn(
            turn["content"],
            turn["reasoning"],
            [ToolCall(c["id"], c["name"], c["arguments"], c["result"]) for c in turn["calls"]],
            turn["finish_reason"],
        )
        for turn in line["turns"]
    ]
    fields = {key: line[key] for key in JOURNALLED if key != "turns"}
    # Lines of an earlier version 2 lack the fields added to every row since: their zero values.
    fields["usage"], fields["verification"] = (
        current_usage(fields["usage"]),
        current_verification(fields["verification"]),
    )
    return Sample(
        **fields,
        turns=turns,
        discarded=line.get("discarded"),
        redactions=line.get("redactions") or {},
        nonzero_exits=line.get("nonzero_exits") or {},
        tokens=line.get("tokens"),
    )


@lru_cache(maxsize=64)
def _encoded(system: str) -> orjson.Fragment:
    """The JSON of the system turn of `system` (most samples of a run have the same), made once."""
    return orjson.Fragment(dumps(turn_of("system", system)))


def _legacy_prompt(record: dict) -> str:
    return next((t["value"] for t in record["conversations"] if t.get("from") == "human"), "")
