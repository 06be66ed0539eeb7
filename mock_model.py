"""The scripted model behind `--model=mock` and the test suite.

It reads an OpenAI chat-completions request and decides the reply the way a small tool-using model
would: call the offered tools sensibly for a turn or two, reason in every turn, then answer.
A prompt can steer it with directives such as ``[mock turns=3 reasoning=think fail=429 times=2]``:

    turns=N          tool-calling turns before the final answer (default: what the plan needs)
    reasoning=KIND   reasoning | reasoning_content | reasoning_details | think | scratchpad | none
    fail=STATUS      answer this HTTP status (with ``times=N`` only the first N requests)
    retry_after=S    Retry-After header sent with a failure
    latency=S        extra seconds before answering
    bad_json         the first tool call carries arguments that are not JSON
    unknown_tool     the first tool call names a tool that was not offered
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

DIRECTIVE = re.compile(r"\[mock\s+([^\]]*)\]")


@dataclass
class Directives:
    turns: int | None = None
    reasoning: str = "reasoning"
    fail: int | None = None
    times: int | None = None
    retry_after: float | None = None
    latency: float = 0.0
    bad_json: bool = False
    unknown_tool: bool = False

    @classmethod
    def parse(cls, prompt: str) -> Directives:
        found = cls()
        for match in DIRECTIVE.finditer(prompt):
            for word in match.group(1).split():
                key, _, value = word.partition("=")
                if key in ("bad_json", "unknown_tool"):
                    setattr(found, key, True)
                elif key in ("turns", "fail", "times"):
                    setattr(found, key, int(value))
                elif key in ("retry_after", "latency"):
                    setattr(found, key, float(value))
                elif key == "reasoning":
                    found.reasoning = value
        return found


@dataclass
class Reply:
    """What the server sends back: an HTTP status with headers, or a chat message with usage."""

    status: int = 200
    headers: dict = field(default_factory=dict)
    message: dict = field(default_factory=dict)
    finish_reason: str = "stop"
    usage: dict = field(default_factory=dict)


def first_user_text(messages: list[dict]) -> str:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
            return content or ""
    return ""


def _call(turn: int, index: int, name: str, arguments: dict | str) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": f"call_{turn}_{index}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def _plan(offered: set[str], prompt: str) -> list[list[tuple[str, dict]]]:
    """Tool calls per turn, from the tools on offer."""
    first, second = [], []
    if "terminal" in offered:
        first.append(("terminal", {"command": "echo mock-model-was-here && pwd && ls -a"}))
    if "write_file" in offered:
        first.append(("write_file", {"path": "notes.txt", "content": f"Task: {prompt[:80]}\n"}))
        if "read_file" in offered:
            second.append(("read_file", {"path": "notes.txt"}))
    return [turn for turn in (first, second) if turn]


def _with_reasoning(kind: str, text: str, content: str) -> dict:
    message = {"role": "assistant", "content": content}
    if kind == "think":
        message["content"] = f"<think>{text}</think>\n{content}"
    elif kind == "scratchpad":
        message["content"] = f"<REASONING_SCRATCHPAD>{text}</REASONING_SCRATCHPAD>\n{content}"
    elif kind == "reasoning_details":
        message["reasoning_details"] = [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]
    elif kind in ("reasoning", "reasoning_content"):
        message[kind] = text
    return message


def reply(request: dict, attempts: int, turns: int | None = None) -> tuple[Reply, float]:
    """The reply to one request and the extra latency before it. `attempts` counts earlier
    requests for the same prompt (fault directives with ``times`` use it); `turns` is the server's
    default number of tool-calling turns, which a prompt's own directive overrides."""
    messages = request.get("messages") or []
    prompt = first_user_text(messages)
    steer = Directives.parse(prompt)
    if steer.fail and (steer.times is None or attempts < steer.times):
        headers = {} if steer.retry_after is None else {"Retry-After": f"{steer.retry_after:g}"}
        return Reply(status=steer.fail, headers=headers), steer.latency

    offered = {tool["function"]["name"] for tool in request.get("tools") or []}
    plan = _plan(offered, prompt)
    turns = next((n for n in (steer.turns, turns) if n is not None), len(plan))
    turn = sum(1 for message in messages if message.get("role") == "assistant")
    results = [m for m in messages if m.get("role") == "tool"]

    if turn < turns and offered:
        calls = plan[turn] if turn < len(plan) else [_filler(offered, turn)]
        tool_calls = [_call(turn, i, name, args) for i, (name, args) in enumerate(calls)]
        if turn == 0 and steer.bad_json:
            tool_calls[0]["function"]["arguments"] = '{"command": "echo broken'
        if turn == 0 and steer.unknown_tool:
            tool_calls[0]["function"]["name"] = "hallucinated_tool"
        thought = f"Turn {turn + 1}: to make progress on '{prompt[:60]}' I will call " + ", ".join(
            name for name, _ in calls
        )
        message = _with_reasoning(steer.reasoning, thought, "")
        message["tool_calls"] = tool_calls
        finish = "tool_calls"
    else:
        seen = (results[-1].get("content") or "")[:200] if results else "nothing yet"
        thought = f"I have what I need after {turn} tool turns; the last result was: {seen[:80]}"
        answer = f"Here is my answer to '{prompt[:60]}'. The tools showed: {seen}"
        message = _with_reasoning(steer.reasoning, thought, answer)
        finish = "stop"

    prompt_tokens = sum(len(json.dumps(m)) for m in messages) // 4
    completion_tokens = len(json.dumps(message)) // 4
    reasoning_tokens = len(thought) // 4 if steer.reasoning != "none" else 0
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "cost": round((prompt_tokens + 4 * completion_tokens) * 1e-7, 8),
    }
    return Reply(message=message, finish_reason=finish, usage=usage), steer.latency


def _filler(offered: set[str], turn: int) -> tuple[str, dict]:
    """The call for the extra turns asked for with ``turns=N`` beyond the plan."""
    if "terminal" in offered:
        return "terminal", {"command": f"echo step {turn + 1}"}
    if "read_file" in offered:
        return "read_file", {"path": "notes.txt"}
    return sorted(offered)[0], {}
