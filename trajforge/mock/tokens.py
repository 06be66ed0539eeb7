"""The scripted server's token ids, answered as vLLM answers `"return_token_ids": true` and
`"logprobs": true`: a deterministic fake tokenizer (one token per UTF-8 byte of a rendered chat
template), so tests can check every id the runner keeps.

The template renders each message as ``<|role|>body<|end|>`` and ends the prompt with
``<|assistant|>``; an assistant body is its reasoning (``<think>..</think>`` from `reasoning` or
`reasoning_content`), its content, then ``<tool_call>name arguments</tool_call>`` per call, the
arguments as the text sent. The completion is the reply's body followed by ``<|end|>``. So the
template is append-only as long as the client sends each reply back as the model wrote it; with
``[mock template=drift]`` the earlier assistant turns lose their reasoning (as Qwen3's template drops
it), and the prompt ids of every later turn no longer start with the earlier ones.
"""

from __future__ import annotations

import json

END = "<|end|>"


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(p.get("text", "") for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return json.dumps(value)


def body(message: dict, reasoning: bool = True) -> str:
    """An assistant message as the template renders it (without its role header and end)."""
    thought = message.get("reasoning") or message.get("reasoning_content")
    out = f"<think>{thought}</think>" if reasoning and isinstance(thought, str) and thought else ""
    out += _text(message.get("content"))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out += f"<tool_call>{_text(function.get('name'))} {_text(function.get('arguments'))}</tool_call>"
    return out


def render(messages: list[dict], tools: list | None, drift: bool = False) -> str:
    """The prompt: the offered tools, every message, then the header of the reply to come."""
    out = f"<|tools|>{json.dumps(tools or [])}{END}"
    for message in messages:
        role = str(message.get("role"))
        if role == "assistant":
            text = body(message, reasoning=not drift)
        elif role == "tool":
            text = f"{message.get('tool_call_id')}: {_text(message.get('content'))}"
        else:
            text = _text(message.get("content"))
        out += f"<|{role}|>{text}{END}"
    return out + "<|assistant|>"


def ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def logprob(position: int, token: int) -> float:
    """A made-up but fixed logprob per (position, token), so a test can tell them apart."""
    return -round(((token * 31 + position * 7) % 97) / 100 + 0.01, 4)


def entries(tokens: list[int], start: int = 0, server: str = "vllm") -> list[dict]:
    """`logprobs.content` as vLLM sends it: one entry per completion token (llama.cpp's name its id too)."""
    out = [
        {"token": bytes([t]).decode("latin-1"), "logprob": logprob(start + i, t), "bytes": [t], "top_logprobs": []}
        for i, t in enumerate(tokens)
    ]
    return [{"id": t} | entry for t, entry in zip(tokens, out, strict=True)] if server == "llamacpp" else out


def of_reply(request: dict, message: dict, drift: bool) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of a reply `message` to `request`."""
    prompt = ids(render(request.get("messages") or [], request.get("tools"), drift))
    return prompt, ids(body(message) + END)


def attach(completion: dict, request: dict, message: dict, drift: bool, server: str = "vllm") -> None:
    """A plain reply's ids, where vLLM puts them: `prompt_token_ids` at the top, the completion's per
    choice; llama.cpp ignores return_token_ids and names each token's id in its logprobs entry."""
    prompt, completion_ids = of_reply(request, message, drift)
    choice = completion["choices"][0]
    if request.get("return_token_ids") and server == "vllm":
        completion["prompt_token_ids"] = prompt
        choice["token_ids"] = completion_ids
    if request.get("logprobs"):
        choice["logprobs"] = {"content": entries(completion_ids, 0, server)}


def pieces(completion_ids: list[int], count: int) -> list[list[int]]:
    """The completion ids cut into `count` consecutive pieces (a stream's chunks), the last the longest."""
    size = len(completion_ids) // count if count else 0
    cuts = [i * size for i in range(count)] + [len(completion_ids)]
    return [completion_ids[cuts[i] : cuts[i + 1]] for i in range(count)]


def asked(request: dict) -> bool:
    return bool(request.get("return_token_ids") or request.get("logprobs"))


def spread(chunks: list[dict], request: dict, message: dict, drift: bool, server: str = "vllm") -> None:
    """A stream's ids, where vLLM puts them: `prompt_token_ids` in the first chunk, then each chunk's
    choice carries the ids (and logprobs) of its own piece of the completion."""
    prompt, completion_ids = of_reply(request, message, drift)
    carrying = [chunk for chunk in chunks if chunk.get("choices")]
    ids = request.get("return_token_ids") and server == "vllm"
    if ids:
        carrying[0]["prompt_token_ids"] = prompt
    start = 0
    for chunk, piece in zip(carrying, pieces(completion_ids, len(carrying)), strict=True):
        choice = chunk["choices"][0]
        if ids:
            choice["token_ids"] = piece
        if request.get("logprobs"):
            choice["logprobs"] = {"content": entries(piece, start, server)}
        start += len(piece)
