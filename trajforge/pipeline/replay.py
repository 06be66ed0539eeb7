"""A finished sample acted again without its model (--rescore): the actor in the agent's place.

A judge reads the stored conversation, and needs nothing else. A command, hidden tests or a Python
verifier need the workspace the agent left: in a fresh environment with the task in place, the recorded
calls that change the environment (REPLAYED: terminal commands, file writes and patches, code runs) run
again in order, with their recorded arguments. A replayed call whose result differs from the recorded
one (its exit code, or its output once timings are masked) marks the sample diverged. Web, browser,
image and vision calls, a user's own tools and MCP servers are not replayed: their recorded results
stand, and the verification's output names them. A call whose saved arguments the secret redaction
changed cannot run as it ran: it is not replayed, and the sample is diverged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trajforge.agent.loop import AgentResult
from trajforge.journal.sample import Sample
from trajforge.model.usage import empty_usage
from trajforge.secrets import KINDS
from trajforge.tools import Tool, call_tool
from trajforge.tools.session import ToolSession

REPLAYED = ("terminal", "write_file", "patch", "execute_code")
MASKS = tuple(KINDS.values())  # what the redaction writes in place of a secret
# A duration in a tool's output ("0.52s", "12 ms", "real 0m0.003s") is not what the call did.
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s*(?:ms|s|sec|seconds)\b|\breal\s+\S+|\buser\s+\S+|\bsys\s+\S+")


def masked(value: Any) -> Any:
    """A tool result as replays compare it: durations masked in its text."""
    if isinstance(value, str):
        return TIMING.sub("<time>", value)
    if isinstance(value, dict):
        return {key: masked(item) for key, item in value.items() if key not in ("duration_seconds", "elapsed")}
    if isinstance(value, list):
        return [masked(item) for item in value]
    return value


@dataclass
class Replay:
    """The stored session of `sample`; with `rebuild`, its environment-changing calls run again first."""

    sample: Sample
    tools: dict[str, Tool]  # every tool the run knows, by name
    rebuild: bool
    diverged: list[str] = field(default_factory=list)  # what differed, call by call
    kept: list[str] = field(default_factory=list)  # calls not replayed (their recorded results stand)

    async def __call__(self, session: ToolSession, entry: dict) -> AgentResult:
        sample = self.sample
        if self.rebuild:
            await self.replay(session)
        return AgentResult(sample.turns, sample.api_calls, 0, sample.exit_reason, empty_usage(), sample.model_reported)  # type: ignore[arg-type]

    async def replay(self, session: ToolSession) -> None:
        for number, turn in enumerate(self.sample.turns, 1):
            for call in turn.calls:
                if call.name not in REPLAYED or call.name not in self.tools:
                    self.kept.append(call.name)
                    continue
                if any(mask in call.arguments for mask in MASKS):  # what ran is not what was saved
                    self.diverged.append(f"turn {number} {call.name}: not replayed, the secret redaction changed it")
                    continue
                again = await call_tool(session, call.name, call.arguments, self.tools)
                if masked(again) != masked(call.result):
                    self.diverged.append(f"turn {number} {call.name}: {_differs(call.result, again)}")

    def said(self) -> str:
        """What the replay says in the verification's output ("" when it was not needed)."""
        if not self.rebuild:
            return ""
        lines = [f"replay: {len(self.diverged)} call(s) diverged" if self.diverged else "replay: as recorded"]
        lines += self.diverged[:5]
        if self.kept:
            lines.append(f"not replayed (recorded results stand): {', '.join(sorted(set(self.kept)))}")
        return "\n".join(lines) + "\n"


def _differs(recorded: Any, now: Any) -> str:
    if isinstance(recorded, dict) and isinstance(now, dict) and recorded.get("exit_code") != now.get("exit_code"):
        return f"exit code {recorded.get('exit_code')} then, {now.get('exit_code')} now"
    return f"recorded {str(recorded)[:80]!r}, now {str(now)[:80]!r}"
