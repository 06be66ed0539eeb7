"""How an assistant reply goes back into the conversation for the next call: as the model wrote it, with
--token_ids (so a template renders the same tokens again), else as the loop read it (what plain runs
have always sent: their cache keys stay the same). The chat model chooses (ChatModel.echo)."""

from __future__ import annotations

from trajectory import Turn

ECHOED = ("content", "reasoning", "reasoning_content", "reasoning_details")


def exact_message(message: dict, turn: Turn) -> dict:
    """The reply as the model wrote it (--token_ids): its content untouched, its reasoning in the field
    the server sent it in, each call's arguments byte for byte, so that a template that renders the
    conversation again renders the same tokens. Only a call id the loop had to make up is ours."""
    reply = {"role": "assistant"} | {key: message[key] for key in ECHOED if key in message}
    sent = message.get("tool_calls")
    if not isinstance(sent, list) or len(sent) != len(turn.calls):  # hostile: as the loop reads the calls
        return reply | {"tool_calls": read_message(message, turn)["tool_calls"]}
    calls = []
    for entry, call in zip(sent, turn.calls, strict=True):
        function = entry.get("function") if isinstance(entry, dict) else None
        if isinstance(function, dict) and all(isinstance(function.get(key), str) for key in ("name", "arguments")):
            calls.append(entry | {"id": call.id})
        else:
            function = {"name": call.name, "arguments": call.arguments}
            calls.append({"id": call.id, "type": "function", "function": function})
    return reply | {"tool_calls": calls}


def read_message(message: dict, turn: Turn) -> dict:
    """The reply as it goes back into the conversation: its content without reasoning, and its calls."""
    reply: dict[str, object] = {"role": "assistant", "content": turn.content}
    if message.get("reasoning_details"):  # echoed so providers keep their reasoning across tool use
        reply["reasoning_details"] = message["reasoning_details"]
    reply["tool_calls"] = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in turn.calls
    ]
    return reply
