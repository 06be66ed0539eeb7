"""export/atif.jsonl: one ATIF trajectory per line (Agent Trajectory Interchange Format, v1.4, the
format of Harbor, laude-institute/harbor docs/rfcs/0001-trajectory-format.md).

Steps: the system prompt (source "system"), the prompt ("user"), then one "agent" step per assistant
turn with its `reasoning_content`, `tool_calls` [{tool_call_id, function_name, arguments}] and an
`observation` whose results answer the calls by `source_call_id`. ATIF requires `arguments` to be an
object: arguments the model sent that are not a JSON object are kept as {"_unparsed": "<text>"}.
Token counts are recorded per trajectory, not per model call, so they go to `final_metrics`; a turn
that carries its own `usage` (a later record format) gets per-step `metrics` from it.
"""

from __future__ import annotations

from trajectory import known_cost, known_reward
from trajforge.export.openai import arguments_object
from trajforge.export.record import Conversation

SCHEMA_VERSION = "ATIF-v1.4"
AGENT_NAME = "batch-runner"


def _metrics(usage: dict) -> dict:
    metrics = {key: usage[key] for key in ("prompt_tokens", "completion_tokens", "cached_tokens") if key in usage}
    if known_cost(usage) is not None:
        metrics["cost_usd"] = usage["cost"]
    if "reasoning_tokens" in usage:
        metrics["extra"] = {"reasoning_tokens": usage["reasoning_tokens"]}
    return metrics


def steps(conversation: Conversation, record: dict, model: str) -> list[dict]:
    out: list[dict] = [
        {"step_id": 1, "source": "system", "message": conversation.system},
        {"step_id": 2, "source": "user", "message": conversation.prompt},
    ]
    gpt_turns = [turn for turn in record.get("conversations") or [] if turn.get("from") == "gpt"]
    for number, step in enumerate(conversation.steps):
        agent: dict = {"step_id": len(out) + 1, "source": "agent", "model_name": model, "message": step.content}
        if step.reasoning:
            agent["reasoning_content"] = step.reasoning
        if step.calls:
            agent["tool_calls"] = [
                {"tool_call_id": call.id, "function_name": call.name, "arguments": arguments_object(call)}
                for call in step.calls
            ]
            agent["observation"] = {
                "results": [{"source_call_id": call.id, "content": call.result_text()} for call in step.calls]
            }
        usage = gpt_turns[number].get("usage") if number < len(gpt_turns) else None
        if isinstance(usage, dict):
            agent["metrics"] = _metrics(usage)
        if step.finish_reason:
            agent["extra"] = {"finish_reason": step.finish_reason}
        out.append(agent)
    return out


def row(conversation: Conversation, record: dict, version: str) -> dict:
    metadata = record.get("metadata") or {}
    usage = metadata.get("usage") or {}
    model = str(metadata.get("model") or "")
    run_name = str(metadata.get("run_name") or "")
    sample = metadata.get("sample_index", 0)
    every = steps(conversation, record, model)
    final = {
        "total_prompt_tokens": usage.get("prompt_tokens"),
        "total_completion_tokens": usage.get("completion_tokens"),
        "total_cached_tokens": usage.get("cached_tokens"),
        "total_cost_usd": known_cost(usage),
        "total_steps": len(every),
        "extra": {"reasoning_tokens": usage.get("reasoning_tokens"), "api_calls": record.get("api_calls")},
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": f"{run_name}/{record.get('prompt_index')}/{sample}",
        "agent": {"name": AGENT_NAME, "version": version, "model_name": model},
        "steps": every,
        "final_metrics": final,
        "extra": {
            "run_name": run_name,
            "prompt_index": record.get("prompt_index"),
            "sample_index": sample,
            "exit_reason": metadata.get("exit_reason"),
            "completed": record.get("completed"),
            "partial": record.get("partial"),
            "duration_seconds": metadata.get("duration_seconds"),
            "reward": known_reward(metadata),
            "toolsets_used": record.get("toolsets_used"),
        },
    }
