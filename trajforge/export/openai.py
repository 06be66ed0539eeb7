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

from typing import Any

from trajectory import ToolCall, known_reward
from trajforge.journal.sample import Sample
from trajforge.safejson import UNPARSED, parse


def arguments_object(call: ToolCall) -> dict:
    """The call's arguments as the object the model wrote, or {"_unparsed": text} when they are not one."""
    try:
        value = parse(call.arguments)
    except (ValueError, TypeError):
        value = None
    return value if isinstance(value, dict) else {UNPARSED: call.arguments}


def tool_schemas(sample: Sample) -> list[dict]:
    """The `tools` column: the functions offered, as OpenAI tool objects."""
    return [{"type": "function", "function": tool} for tool in sample.tools]


def _call(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments_object(call)}}


def assistant_and_tool_messages(sample: Sample) -> list[dict]:
    """Per assistant turn its message, then one tool message per call answering the call's id."""
    out = []
    for step in sample.turns:
        message: dict[str, Any] = {"role": "assistant", "content": step.content, "reasoning_content": step.reasoning}
        if step.calls:
            message["tool_calls"] = [_call(call) for call in step.calls]
        out.append(message)
        out.extend(
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": call.result_text()}
            for call in step.calls
        )
    return out


def messages(sample: Sample) -> list[dict]:
    return [{"role": "user", "content": sample.prompt}, *assistant_and_tool_messages(sample)]


def row(sample: Sample) -> dict:
    return {
        "messages": messages(sample),
        "tools": tool_schemas(sample),
        "prompt_index": sample.prompt_index,
        "sample_index": sample.sample_index,
        "reward": known_reward(sample.verification),  # null when unverified: the features type it float64
        "model": sample.model,
        "run_name": sample.run_name,
    }
