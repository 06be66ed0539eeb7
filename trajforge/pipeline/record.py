"""A run's sample as its batch file keeps it: the journalled Sample (trajforge/journal), verified, with
what the merge counts beside it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from trajectory import discard_reason, nonzero_exits, record_usage, tool_stats
from trajforge.agent.loop import AgentResult
from trajforge.journal.sample import Sample, now
from trajforge.model.tokens import drift_text
from trajforge.pipeline.sample import Acted


@dataclass(frozen=True)
class Line:
    """A sample's line of its batch file, and why the merge drops it (None: kept)."""

    data: bytes
    discarded: str | None


@dataclass(frozen=True)
class TrajectoryRecorder:
    """Builds one sample's record; `tool_names` are every tool the run can offer (the keys of tool_stats, with
    any other its MCP servers listed for the sample)."""

    prompt_index: int
    entry: dict
    toolsets: list[str]
    tool_names: list[str]
    metadata: dict  # batch_num, model, run_name, sample_index

    def sample(self, result: AgentResult, seconds: float) -> Sample:
        """The finished sample, not yet verified."""
        metadata = self.metadata
        return Sample(
            prompt_index=self.prompt_index,
            sample_index=metadata["sample_index"],
            batch_num=metadata["batch_num"],
            entry=self.entry,
            tools=[t.schema["function"] for t in result.tools.values()],
            toolsets=self.toolsets,
            turns=result.turns,
            api_calls=result.api_calls,
            exit_reason=result.exit_reason,
            usage=record_usage(result.usage),
            verification={},
            tool_stats=tool_stats(result.turns, sorted({*self.tool_names, *result.tools}))[0],
            model=metadata["model"],
            model_reported=result.model_reported,
            run_name=metadata["run_name"],
            duration_seconds=round(seconds, 3),
            timestamp=now(),
            token_drift=drift_text(result.tokens or []),
        )

    def view(self, result: AgentResult, seconds: float) -> dict:
        """The ShareGPT record so far, as a Python verifier is handed it (trajectories.jsonl's form)."""
        return self.sample(result, seconds).record()

    def finish(self, acted: Acted) -> Line:
        return batch_line(self.sample(acted.result, acted.seconds), acted, set(acted.result.tools))


def batch_line(sample: Sample, acted: Acted, offered: set[str]) -> Line:
    """Pure: the sample's journal line with its verification and what the merge counts beside it
    (discarded, redactions, tokens, nonzero_exits)."""
    result = acted.result
    reason = discard_reason(result.turns, offered)
    tokens = {"turns": result.tokens, "missing": result.tokens_missing} if result.tokens is not None else None
    finished = replace(
        sample,
        verification=acted.verification,
        discarded=reason,
        redactions=dict(acted.redactions),
        tokens=tokens,
        nonzero_exits=nonzero_exits(result.turns),
    )
    return Line(finished.journal(), reason)
