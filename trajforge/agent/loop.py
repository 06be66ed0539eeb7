"""The agent loop: send the conversation and the offered tools, run the tool calls, repeat."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from trajectory import ToolCall, Turn, split_reasoning
from trajforge.model.client import ModelClient
from trajforge.model.usage import add_usage, empty_usage
from trajforge.tools import Tool, call_tool
from trajforge.tools.session import ToolSession

Log = Callable[[str, str], None]


@dataclass
class AgentResult:
    turns: list[Turn]
    api_calls: int
    retries: int
    exit_reason: str  # "completed" | "max_turns"
    usage: dict


async def run_agent(
    client: ModelClient,
    session: ToolSession,
    prompt: str,
    tools: dict[str, Tool],
    max_turns: int,
    preamble: list[dict],
    log: Log | None = None,
) -> AgentResult:
    """Send messages and tools; run each tool call and send the results back; stop on a reply
    without tool calls (completed) or after `max_turns` model calls (partial)."""
    schemas = [t.schema for t in tools.values()]
    messages = [{"role": "user", "content": prompt}]
    result = AgentResult([], 0, 0, "max_turns", empty_usage())
    while result.api_calls < max_turns:
        message, usage, retries = await client.complete(preamble + messages, schemas, log)
        result.api_calls += 1
        result.retries += retries
        add_usage(result.usage, usage)
        reasoning, content = split_reasoning(message)
        turn = Turn(content, reasoning, _tool_calls(message, result.api_calls))
        result.turns.append(turn)
        if log:
            names = ", ".join(c.name for c in turn.calls) or "none"
            log(f"turn {result.api_calls} (tool calls: {names})", content or reasoning)
        if not turn.calls:
            result.exit_reason = "completed"
            break
        messages.append(_assistant_message(message, turn))
        for call in turn.calls:
            call.result = await call_tool(session, call.name, call.arguments, tools)
            if log:
                log(f"  {call.name} result", json.dumps(call.result))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(call.result)})
    return result


def _tool_calls(message: dict, turn: int) -> list[ToolCall]:
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # some servers send an object
            arguments = json.dumps(arguments or {})
        calls.append(ToolCall(call.get("id") or f"call_{turn}_{i}", function.get("name") or "", arguments))
    return calls


def _assistant_message(message: dict, turn: Turn) -> dict:
    """The reply as it goes back into the conversation: its content without reasoning, and its calls."""
    reply = {"role": "assistant", "content": turn.content}
    if message.get("reasoning_details"):  # echoed so providers keep their reasoning across tool use
        reply["reasoning_details"] = message["reasoning_details"]
    reply["tool_calls"] = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in turn.calls
    ]
    return reply
