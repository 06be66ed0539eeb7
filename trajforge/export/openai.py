"""export/openai.jsonl: OpenAI chat `messages` with structured `tool_calls` and a `tools` column, what
TRL and axolotl (`chat_template`) read. Arguments and the tools are JSON strings, so every row has the
same schema on the HF Hub whatever the tools take."""

from __future__ import annotations

from functools import lru_cache

from trajforge.export.record import Conversation, dumps, offered_tools


@lru_cache(maxsize=64)
def tool_schemas(system: str) -> str:
    """The `tools` column: the schemas the system turn lists, as OpenAI tool objects (JSON text)."""
    return dumps([{"type": "function", "function": tool} for tool in offered_tools(system)])


def messages(conversation: Conversation) -> list[dict]:
    """System (the one the record holds), user, then per assistant turn its message and one tool
    message per call, answering the call's id."""
    out = [{"role": "system", "content": conversation.system}, {"role": "user", "content": conversation.prompt}]
    for step in conversation.steps:
        message = {"role": "assistant", "content": step.content, "reasoning_content": step.reasoning}
        if step.calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json()}}
                for call in step.calls
            ]
        out.append(message)
        out.extend(
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": call.result_text()}
            for call in step.calls
        )
    return out


def row(conversation: Conversation, record: dict) -> dict:
    metadata = record.get("metadata") or {}
    out = {
        "messages": messages(conversation),
        "tools": tool_schemas(conversation.system),
        "prompt_index": record.get("prompt_index"),
    }
    for key in ("sample_index", "reward"):  # present once samples and verification exist (issue 14)
        if key in metadata:
            out[key] = metadata[key]
    out["model"] = metadata.get("model", "")
    out["run_name"] = metadata.get("run_name", "")
    return out
