"""The agent loop run in-process on one prompt: a real ModelClient against the scripted model's server
on 127.0.0.1, real terminal and file tools in a real local environment."""

from __future__ import annotations

import asyncio

from tool_session import tool_session

from trajforge.agent.loop import AgentResult, run_agent
from trajforge.caller import Caller
from trajforge.model.chat import ChatModel
from trajforge.model.settings import ModelSettings
from trajforge.tools.toolsets import by_toolset

OFFERED = {t.name: t for toolset in ("terminal", "file") for t in by_toolset()[toolset]}


def agent(
    server,
    prompt: str,
    *,
    max_turns: int = 10,
    preamble: list[dict] | None = None,
    log: list[str] | None = None,
    max_tool_calls: int = 32,
    timeout: float | None = None,
    **model,
) -> AgentResult:
    """run_agent on `prompt` with the terminal and file tools; `model` overrides ModelSettings."""
    settings = ModelSettings(
        **{"model": "test-model", "base_url": server.base_url, "api_key": "test-key", "max_retries": 2} | model
    )

    def record(label: str, text: str) -> None:
        log.append(f"{label}: {text}")

    async def go() -> AgentResult:
        client = ChatModel(settings)
        try:
            async with tool_session(caller=Caller(log=record if log is not None else None)) as session:
                return await run_agent(
                    client,
                    session,
                    prompt,
                    OFFERED,
                    max_turns,
                    preamble or [],
                    max_tool_calls=max_tool_calls,
                    timeout=timeout,
                )
        finally:
            await client.close()

    return asyncio.run(go())


def calls(result: AgentResult) -> list[list[str]]:
    return [[call.name for call in turn.calls] for turn in result.turns]
