"""export/llamafactory.json and export/dataset_info.json: LLaMA-Factory's `sharegpt` formatting with
the roles human, gpt, function_call and observation, and a `tools` column (JSON text of the function
schemas, which its tool formatters json.loads). There is no `system` column: the trajectory's system turn
only lists the tools, and LLaMA-Factory's templates write the tools into the system prompt themselves
(format_tools), so passing it would list every tool twice; the template's default system is used.

LLaMA-Factory's converter (src/llamafactory/data/converter.py, SharegptDatasetConverter) drops a row
unless human and observation turns sit at odd positions and gpt and function_call turns at even ones
(1-based), and the count is even (the last turn is the model's). So one assistant turn with several
calls is ONE function_call turn holding a JSON list of {name, arguments} (its FunctionFormatter takes a
list), and their results ONE observation turn, joined with `</tool_response>` / `<tool_response>` as
its own OpenAI converter joins several results. Reasoning goes in front as `<think>...</think>`, which
its formatters lift out as the thought. Text that came with tool calls has no place in a function_call
turn (the value must parse as JSON) and is left out; a trajectory that stops after a tool result (a
limit) ends at its last function_call. Arguments are objects as in openai.jsonl ({"_unparsed": text}
when the model's were not one).
"""

from __future__ import annotations

from trajectory import Turn
from trajforge.export.openai import arguments_object
from trajforge.journal.sample import Sample
from trajforge.safejson import dumps

FILE = "llamafactory.json"  # its name in export/ (trajforge/builtin.py registers it so)
INFO_FILE = "dataset_info.json"
RESULT_JOIN = "\n</tool_response>\n<tool_response>\n"


def _thought(step: Turn) -> str:
    return f"<think>\n{step.reasoning}\n</think>\n\n" if step.reasoning else ""


def turns(sample: Sample) -> list[dict]:
    out = [{"from": "human", "value": sample.prompt}]
    for step in sample.turns:
        if not step.calls:
            out.append({"from": "gpt", "value": _thought(step) + step.content})
            continue
        calls = [{"name": call.name, "arguments": arguments_object(call)} for call in step.calls]
        out.append({"from": "function_call", "value": _thought(step) + dumps(calls).decode()})
        out.append({"from": "observation", "value": RESULT_JOIN.join(call.result_text() for call in step.calls)})
    if out[-1]["from"] == "observation":
        out.pop()
    return out


def row(sample: Sample) -> dict:
    return {
        "conversations": turns(sample),
        "tools": dumps(sample.tools).decode(),
    }


def dataset_info(name: str) -> dict:
    """The entry LLaMA-Factory's data/dataset_info.json needs for llamafactory.json."""
    return {
        name: {
            "file_name": FILE,
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "tools": "tools"},
            "tags": {
                "role_tag": "from",
                "content_tag": "value",
                "user_tag": "human",
                "assistant_tag": "gpt",
                "observation_tag": "observation",
                "function_tag": "function_call",
            },
        }
    }
