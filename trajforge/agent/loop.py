"""The agent loop: send the conversation and the offered tools, run the tool calls, repeat."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Literal

from trajectory import Turn, split_reasoning
from trajforge.agent.calls import read_tool_calls
from trajforge.caller import Log
from trajforge.flags import default
from trajforge.model.chat import ChatModel
from trajforge.model.outcomes import ModelCallFailed
from trajforge.model.usage import add_usage, empty_usage, usage_total
from trajforge.tools import Tool, call_tool
from trajforge.tools.session import ToolSession

# Why a session ended: its final answer (completed), or partial: --max_turns, --prompt_timeout, an answer
# cut off or filtered (the server's finish_reason), --max_cost_per_prompt, --max_tokens_per_prompt.
ExitReason = Literal["completed", "max_turns", "timeout", "length", "content_filter", "cost_limit", "token_limit"]


@dataclass
class AgentResult:
    turns: list[Turn]
    api_calls: int
    retries: int
    exit_reason: ExitReason
    usage: dict
    model_reported: str = ""  # the model name the endpoint reported in its first reply that named one
    tokens: list[dict] | None = None  # with --token_ids: per model call, {prompt_token_ids, token_ids, logprobs}
    tokens_missing: str = ""  # with --token_ids: what the first reply without them lacked
    tools: dict[str, Tool] = field(default_factory=dict)  # what the model was offered, by name


# A final answer that ended for one of these reasons is cut off (max_tokens) or withheld by the
# provider's filter: the session is partial, with the reason as its exit_reason.
CUT_OFF: dict[str, ExitReason] = {"length": "length", "content_filter": "content_filter"}


@dataclass(frozen=True)
class PromptLimits:
    """--max_cost_per_prompt and --max_tokens_per_prompt: the session ends partial once it reaches one."""

    max_cost: float | None = None
    max_tokens: int | None = None

    def reached(self, usage: dict) -> ExitReason | None:
        """The exit reason for a prompt that has used `usage` (its calls and its tools'), or None."""
        if self.max_tokens is not None and usage["total_tokens"] >= self.max_tokens:
            return "token_limit"
        if self.max_cost is not None and usage["cost"] is not None and usage["cost"] >= self.max_cost:
            return "cost_limit"
        return None


async def run_agent(
    client: ChatModel,
    session: ToolSession,
    prompt: str,
    tools: dict[str, Tool],
    max_turns: int,
    preamble: list[dict],
    *,
    max_tool_calls: int = default("max_tool_calls_per_turn"),
    timeout: float | None = None,
    limits: PromptLimits = PromptLimits(),
) -> AgentResult:
    """Send messages and tools; run the tool calls (the first `max_tool_calls` of a reply) and send the
    results back; stop on a reply without tool calls (completed, or partial when the server cut it off
    with finish_reason `length` or `content_filter`), after `max_turns` model calls, after `timeout`
    seconds or before a call once the prompt's usage (its tools' included) reaches a limit (partial,
    with the turns so far: a limit is an outcome, not an error; with no turn at all, the prompt fails
    instead). The model calls are made for the session's caller (its sample's scope, log and retry
    listener)."""
    schemas = [t.schema for t in tools.values()]
    messages = [{"role": "user", "content": prompt}]
    result = AgentResult([], 0, 0, "max_turns", empty_usage(), tools=tools)
    log = session.caller.log
    try:
        async with asyncio.timeout(timeout) as limit:
            while result.api_calls < max_turns:
                reached = limits.reached(usage_total(result.usage, session.usage))
                if reached:
                    result.exit_reason = reached
                    break
                reply = await client.complete(preamble + messages, schemas, session.caller)
                message = reply.message
                result.api_calls += 1
                result.retries += reply.retries
                result.model_reported = result.model_reported or reply.model
                add_usage(result.usage, reply.usage)
                if reply.tokens is not None:
                    result.tokens = (result.tokens or []) + [reply.tokens]
                    result.tokens_missing = result.tokens_missing or reply.tokens_missing
                reasoning, content = split_reasoning(message)
                calls = read_tool_calls(message, result.api_calls, max_tool_calls)
                turn = Turn(content, reasoning, [call for call, _ in calls], reply.finish_reason)
                result.turns.append(turn)
                if log:
                    names = ", ".join(c.name for c in turn.calls) or "none"
                    log(f"turn {result.api_calls} (tool calls: {names})", content or reasoning)
                if not turn.calls:
                    result.exit_reason = CUT_OFF.get(reply.finish_reason, "completed")
                    break
                messages.append(client.echo(message, turn))
                messages += await _answer(session, calls, tools, log)
    except TimeoutError:
        if not limit.expired():
            raise
        if not result.turns:  # nothing to save: the prompt failed and --resume runs it again
            raise ModelCallFailed("timeout", f"no model reply within --prompt_timeout ({timeout:g}s)", 1) from None
        result.exit_reason = "timeout"
    return result


async def _answer(session: ToolSession, calls: list, tools: dict[str, Tool], log: Log | None) -> list[dict]:
    """Run the calls that may run, refuse the others; the tool messages that answer them."""
    for call, _ in calls:  # what a call keeps when the time limit ends the session before its answer
        call.result = {"error": "not run or not finished: the prompt reached its time limit (--prompt_timeout)"}
    answers = []
    for call, refusal in calls:
        call.result = {"error": refusal} if refusal else await call_tool(session, call.name, call.arguments, tools)
        if log:
            log(f"  {call.name} result", json.dumps(call.result))
        answers.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(call.result)})
    return answers
