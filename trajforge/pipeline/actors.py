"""What acts on a task between its setup and its verification: the agent (a run), the task's own
solution (the oracle of --check_tasks) or nothing at all (the no-op that must fail)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from trajforge.agent.loop import AgentResult, PromptLimits, run_agent
from trajforge.environments.folder_task import KEY, FolderSettings
from trajforge.model.chat import ChatModel
from trajforge.model.usage import empty_usage
from trajforge.tools import Tool
from trajforge.tools.session import ToolSession
from trajforge.verification.host_folders import task_files


@dataclass(frozen=True)
class AgentRules:
    """What the run tells every agent session (--max_turns, the preamble, the per-turn and per-prompt limits)."""

    max_turns: int
    preamble: list[dict]
    max_tool_calls: int
    timeout: float | None
    limits: PromptLimits


@dataclass(frozen=True)
class Agent:
    """The model, offered `tools` (each MCP server's as it listed them for the sample), in the agent loop."""

    client: ChatModel
    rules: AgentRules
    tools: dict[str, Tool]

    async def __call__(self, session: ToolSession, entry: dict) -> AgentResult:
        rules = self.rules
        return await run_agent(
            self.client,
            session,
            entry["prompt"],
            session.offered(self.tools),
            rules.max_turns,
            rules.preamble,
            max_tool_calls=rules.max_tool_calls,
            timeout=folder.agent_timeout if (folder := FolderSettings.of(entry)) else rules.timeout,
            limits=rules.limits,
        )


def nothing() -> AgentResult:
    """The result of a session in which no model was called."""
    return AgentResult([], 0, 0, "completed", empty_usage())


async def idle(session: ToolSession, entry: dict) -> AgentResult:
    """An agent that does nothing: a sound task must not pass after it."""
    return nothing()


@dataclass
class Oracle:
    """The entry's `solution` run where the agent would work; `said` keeps what it printed."""

    timeout: float
    said: list[str] = field(default_factory=list)

    async def __call__(self, session: ToolSession, entry: dict) -> AgentResult:
        command = entry.get("solution", "")
        if KEY in entry:  # a task folder's solution/ as Harbor puts it: /solution, solve.sh run with bash
            solution = await asyncio.to_thread(task_files, entry[KEY]["folder"], "solution")
            await session.env.put_folder("/solution", solution)
            command = "bash /solution/solve.sh"
        done = await session.env.exec(command, self.timeout, capped=False)
        why = f" ({done.error})" if done.error else ""
        self.said.append(f"solution: exit {done.exit_code}{why}\n{done.output}")
        return nothing()
