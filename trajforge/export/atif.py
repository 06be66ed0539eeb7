"""export/atif.jsonl: one ATIF trajectory per line (Agent Trajectory Interchange Format, v1.4, the
format of Harbor, laude-institute/harbor docs/rfcs/0001-trajectory-format.md).

Steps: the system prompt (source "system"), the prompt ("user"), then one "agent" step per assistant
turn with its `reasoning_content`, `tool_calls` [{tool_call_id, function_name, arguments}] and an
`observation` whose results answer the calls by `source_call_id`. ATIF requires `arguments` to be an
object: arguments the model sent that are not a JSON object are kept as {"_unparsed": "<text>"}.
Token counts are recorded per trajectory, not per model call, so they go to `final_metrics`.
"""

from __future__ import annotations

from trajectory import known_cost, known_reward
from trajforge.export.openai import arguments_object
from trajforge.journal.sample import Sample

SCHEMA_VERSION = "ATIF-v1.4"
AGENT_NAME = "batch-runner"


def steps(sample: Sample) -> list[dict]:
    out: list[dict] = [
        {"step_id": 1, "source": "system", "message": sample.system},
        {"step_id": 2, "source": "user", "message": sample.prompt},
    ]
    for step in sample.turns:
        agent: dict = {"step_id": len(out) + 1, "source": "agent", "model_name": sample.model, "message": step.content}
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
        if step.finish_reason:
            agent["extra"] = {"finish_reason": step.finish_reason}
        out.append(agent)
    return out


def row(sample: Sample, version: str) -> dict:
    usage = sample.usage
    every = steps(sample)
    final = {
        "total_prompt_tokens": usage.get("prompt_tokens"),
        "total_completion_tokens": usage.get("completion_tokens"),
        "total_cached_tokens": usage.get("cached_tokens"),
        "total_cost_usd": known_cost(usage),
        "total_steps": len(every),
        "extra": {"reasoning_tokens": usage.get("reasoning_tokens"), "api_calls": sample.api_calls},
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": f"{sample.run_name}/{sample.prompt_index}/{sample.sample_index}",
        "agent": {"name": AGENT_NAME, "version": version, "model_name": sample.model},
        "steps": every,
        "final_metrics": final,
        "extra": {
            "run_name": sample.run_name,
            "prompt_index": sample.prompt_index,
            "sample_index": sample.sample_index,
            "exit_reason": sample.exit_reason,
            "completed": sample.completed,
            "partial": sample.partial,
            "duration_seconds": sample.duration_seconds,
            "reward": known_reward(sample.verification),
            "toolsets_used": sample.toolsets,
        },
    }
