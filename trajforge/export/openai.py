"""export/openai.jsonl: rows a trainer passes as is to `tokenizer.apply_chat_template(row["messages"],
tools=row["tools"])` (what TRL's SFT trainer does with a `messages` and a `tools` column).

- `tools`: the offered functions as OpenAI tool objects, a list ({"type": "function", "function": ...}).
- `messages`: the user turn, then per assistant turn its message and one tool message per call. There
  is no system message: the trajectory's system turn only lists the tools, and a chat template lists
  `tools` itself, in its own words, so a second listing would show every tool twice.
- A call's `arguments` are an object, as the model wrote it: templates write `arguments | tojson` or
  iterate `arguments | items`, and a JSON string there renders double-encoded (or fails). Arguments the
  model sent that are not a JSON object are kept as {"_unparsed": "<text>"}, as in atif.jsonl: the row
  stays (the tool's error and the model's recovery are part of the trajectory) and nothing is lost.
- Reasoning is `reasoning_content` on assistant messages (what Qwen3-style templates read), never
  inlined; preferences.jsonl shapes its messages with the same function.
- A message has only the keys it uses (`tool_calls` only when there are calls): Llama 3.1's template
  tests `'tool_calls' in message`. `datasets` loads such messages as its `Json` feature, keys as written.

Every row has the same columns, so runs load together with `datasets` (FEATURES, in the card and docs).
"""

from __future__ import annotations

from functools import lru_cache

from trajectory import known_reward
from trajforge.export.record import Call, Conversation, loads, offered_tools
from trajforge.safejson import UNPARSED


def arguments_object(call: Call) -> dict:
    """The call's arguments as the object the model wrote, or {"_unparsed": text} when they are not one."""
    try:
        value = loads(call.arguments)
    except (ValueError, TypeError):
        value = None
    return value if isinstance(value, dict) else {UNPARSED: call.arguments}


@lru_cache(maxsize=64)
def _schemas(system: str) -> tuple[dict, ...]:
    return tuple({"type": "function", "function": tool} for tool in offered_tools(system))


def tool_schemas(system: str) -> list[dict]:
    """The `tools` column: the schemas the system turn lists, as OpenAI tool objects."""
    return list(_schemas(system))


def _call(call: Call) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments_object(call)}}


def assistant_and_tool_messages(conversation: Conversation) -> list[dict]:
    """Per assistant turn its message, then one tool message per call answering the call's id."""
    out = []
    for step in conversation.steps:
        message: dict[str, object] = {"role": "assistant", "content": step.content, "reasoning_content": step.reasoning}
        if step.calls:
            message["tool_calls"] = [_call(call) for call in step.calls]
        out.append(message)
        out.extend(
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": call.result_text()}
            for call in step.calls
        )
    return out


def messages(conversation: Conversation) -> list[dict]:
    return [{"role": "user", "content": conversation.prompt}, *assistant_and_tool_messages(conversation)]


def row(conversation: Conversation, record: dict) -> dict:
    metadata = record.get("metadata") or {}
    return {
        "messages": messages(conversation),
        "tools": tool_schemas(conversation.system),
        "prompt_index": record.get("prompt_index"),
        "sample_index": metadata.get("sample_index", 0),
        "reward": known_reward(metadata),  # null when unverified: the features type it float64
        "model": metadata.get("model", ""),
        "run_name": metadata.get("run_name", ""),
    }
