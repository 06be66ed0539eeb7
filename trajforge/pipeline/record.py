"""A run's sample as its batch file keeps it: the trajectory record, verified, plus the keys the merge
takes off again."""

from __future__ import annotations

from dataclasses import dataclass

from trajectory import build_record, discard_reason, nonzero_exits, with_verification
from trajforge.agent.loop import AgentResult
from trajforge.model.tokens import drift_text
from trajforge.pipeline.sample import Acted
from trajforge.safejson import dumps
from trajforge.tools import Tool


@dataclass(frozen=True)
class Line:
    """A sample's line of its batch file, and why the merge drops it (None: kept)."""

    data: bytes
    discarded: str | None


@dataclass(frozen=True)
class TrajectoryRecorder:
    """Builds one sample's record; `tool_names` are every tool the run can offer (the keys of tool_stats)."""

    prompt_index: int
    entry: dict
    tools: dict[str, Tool]
    toolsets: list[str]
    tool_names: list[str]
    metadata: dict  # batch_num, model, run_name, sample_index

    def view(self, result: AgentResult, seconds: float) -> dict:
        metadata = self.metadata
        return build_record(
            prompt_index=self.prompt_index,
            entry=self.entry,
            turns=result.turns,
            tool_schemas=[t.schema for t in self.tools.values()],
            toolsets=self.toolsets,
            tool_names=self.tool_names,
            api_calls=result.api_calls,
            exit_reason=result.exit_reason,
            usage=result.usage,
            metadata={
                "batch_num": metadata["batch_num"],
                "model": metadata["model"],
                "model_reported": result.model_reported,
                "run_name": metadata["run_name"],
                "duration_seconds": round(seconds, 3),
                "sample_index": metadata["sample_index"],
                "token_drift": drift_text(result.tokens or []),
            },
        )

    def finish(self, acted: Acted) -> Line:
        return batch_line(self.view(acted.result, acted.seconds), acted, set(self.tools))


def batch_line(record: dict, acted: Acted, offered: set[str]) -> Line:
    """Pure: the record with its verification and the keys the merge takes off again (discarded,
    redactions, tokens, nonzero_exits)."""
    result = acted.result
    with_verification(record, acted.verification)
    reason = discard_reason(result.turns, offered)
    if reason:
        record["discarded"] = reason
    if acted.redactions:  # for statistics.json; the merge takes it off, as it does `discarded`
        record["redactions"] = acted.redactions
    if result.tokens is not None:  # for tokens.jsonl; the merge takes it off trajectories.jsonl
        record["tokens"] = {"turns": result.tokens, "missing": result.tokens_missing}
    exits = nonzero_exits(result.turns)
    if exits:  # for the summary's tool table; taken off by the merge too
        record["nonzero_exits"] = exits
    return Line(dumps(record) + b"\n", reason)  # what orjson cannot encode kept as text
