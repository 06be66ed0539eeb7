"""The scripted model behind `--model=mock` and the test suite.

It reads an OpenAI chat-completions request and decides the reply the way a small tool-using model
would: call every offered toolset sensibly, using what earlier results showed (the image it generated,
the refs of a browser snapshot), reason in every turn, then answer. Web and browser tools read the
first URL of the prompt, else the mock server's own page. Like a model, it opens the browser (the one
costly tool: a browser context is about half a second of CPU) only for a task about a page, one that
names a URL, a page or a site or asks to browse, visit or click, or when nothing else on offer reads
the web. A request whose user message carries an
image is answered as a vision model would; `image_reply` answers the images API; a judge's request as
mock/judge.py says.
A prompt can steer it with directives such as ``[mock turns=3 reasoning=think fail=429 times=2]``
(an unknown word or a bad value is answered with HTTP 400 naming it, so a misspelt directive cannot make a
test pass without testing anything):

    turns=N          tool-calling turns before the final answer (default: what the plan needs)
    reasoning=KIND   reasoning | reasoning_content | reasoning_details | all (the three at once) | think |
                     scratchpad | none
    fail=STATUS      answer this HTTP status (with ``times=N`` only the first N requests)
    flagged          the failure says the input was flagged by moderation (OpenRouter's 403)
    upstream_error   answer 200 with an error in the choice instead of a message (``times=N`` as above); with
                     ``cost=USD`` its usage reports that cost, as a provider that charges for a failed answer
    empty            answer 200 without any choice; streamed, only ``[DONE]`` (``times=N`` as above)
    snoop            the first terminal command prints its parent's command line (where keys hide)
    command=TEXT     the first terminal command is TEXT, percent-decoded (``%20`` for a space)
    call=NAME:ARGS,… one turn per item, each calling the tool NAME (any tool offered, a plugin's too) with ARGS,
                     a JSON object percent-decoded (``%7B%22key%22%3A%22a%22%7D``; optional: ``{}``), in
                     place of the plan; a comma separates turns (write one inside ARGS as ``%2C``)
    alternate        sessions of this prompt alternate (the server counts them from 0): in the odd ones
                     the first terminal command only echoes, so a task the ``command`` solves is solved by
                     every other sample
    quote            the reasoning, the answer and the first terminal command quote the ephemeral system
                     prompt and the prefill (every message before the prompt), as a leaky model would
    echo_key         a failure's message and the answer quote the request's Authorization header, as
                     some servers echo a key they refuse
    retry_after=S    Retry-After header sent with a failure
    latency=S        extra seconds before answering
    bad_json         the first tool call carries arguments that are not JSON
    unknown_tool     the first tool call names a tool that was not offered
    image=url        (in an image prompt) the images API answers a URL instead of base64 data
    sleep=S          the first terminal command sleeps S seconds first
    overflow=FORM    the conversation "does not fit the context", as a server says it (``times=N`` as above):
                     llamacpp (HTTP 500 "Context size has been exceeded."), openai (400, code
                     context_length_exceeded), vllm (400 "This model's maximum context length is ...")
    stop=REASON      the final answer is cut off mid-word with this finish_reason (length, content_filter)
    model=NAME       the replies report NAME as their model (servers often name the model otherwise)
    no_model         the replies carry no ``model`` field at all
    cost=USD         every reply reports this `usage.cost` (the server's own setting otherwise: by default
                     a cost from the tokens, or a fixed one, or none: MockServer(cost=...))
    no_cost          the replies report no cost at all, as vLLM or llama.cpp do
    cached=N         N of the prompt tokens were cached (`usage.prompt_tokens_details.cached_tokens`)
    no_token_ids     asked for token ids (``return_token_ids``), the replies carry none, as most servers
    template=drift   the fake chat template (mock/tokens.py) drops the reasoning of earlier turns
    ids=llamacpp     token ids as llama.cpp's server gives them: only in the logprobs entries, no prompt ids

Hostile replies, to show that none can crash or hang a prompt (the first turn's calls, or every reply
while ``times=N`` lasts):

    name_list        the first tool call's name is a list, not a string
    calls_string     ``tool_calls`` is a string (the calls' JSON text), not a list
    args_number      the first tool call's arguments are a number
    no_ids           the tool calls carry no id
    dup_ids          every tool call carries the same id
    calls=N          the first turn sends N tool calls
    endless          the reply never ends: a stream sends keep-alive comments, a plain body spaces, forever
    trickle=S        the reply comes one byte every S seconds
    huge_mb=N        the reply's content is padded to N MB
    gzip_bomb        the reply is sent with ``Content-Encoding: gzip, gzip``: 2 KB that decode to 512 MB
    args_deep=N      the first tool call's arguments nest a list N levels deep (``{"command": [[...]]}``)
    args_surrogate   the first tool call's arguments hold a lone surrogate (``{"command": "echo \\ud800"}``)
    content_surrogate  the content ends with a lone surrogate (``\ud800`` on the wire)
    body_deep=N      the reply carries a field nested N levels deep (sent as text: any N)
    bad_utf8         the reply's content holds a byte that is not UTF-8
    usage=KIND       the reply's usage is broken: empty ({}), huge (1e300 tokens), negative, strings, list
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import struct
import time
import zlib
from dataclasses import dataclass, field
from urllib.parse import unquote

from trajforge.mock import judge as mock_judge
from trajforge.mock.server_errors import OVERFLOWS

DIRECTIVE = re.compile(r"\[mock\s+([^\]]*)\]")
URL = re.compile(r"https?://[^\s\"'<>\])]+")
ABOUT_A_PAGE = re.compile(r"\bbrows|\b(web ?)?pages?\b|\b(web)?sites?\b|\bclick|\bvisit", re.I)
# A line of browser_snapshot (Playwright's aria snapshot): `  - textbox "Your name" [ref=e5]`.
SNAPSHOT_REF = re.compile(r'^ *- (\w+)(?: ".*?")? \[ref=((?:f\d+)?e\d+)\]', re.M)

PAGE = """<!doctype html>
<html><head><title>The mock page</title></head><body>
<h1>The mock model's page</h1>
<article>
<p>The mock server serves this page so that web_extract and the browser tools have a real page to read
without any network. It holds a short article and a form.</p>
<p>Batch runs of a tool-using agent produce trajectories for fine-tuning; every tool call in them is real.</p>
</article>
<form id="greet"><label for="name">Your name</label> <input id="name" name="name">
<button type="submit">Greet</button></form>
<p id="greeting"></p>
<script>
// The form greets in place: its URL (?name=...) is pushed to the history without loading another page, so
// Back returns to the form, as after a real submission, at a third of the browser's work.
const form = document.getElementById("greet");
const greet = () => {
  const name = new URLSearchParams(location.search).get("name");
  document.getElementById("greeting").textContent = name ? `Hello, ${name}!` : "";
};
form.addEventListener("submit", (event) => {
  event.preventDefault();
  history.pushState(null, "", `?name=${encodeURIComponent(form.elements.name.value)}`);
  greet();
});
addEventListener("popstate", greet);
greet();
</script>
</body></html>
"""


FLAGS: tuple[str, ...] = ("bad_json", "unknown_tool", "flagged", "upstream_error", "empty", "snoop")
FLAGS += ("name_list", "calls_string", "args_number", "no_ids", "dup_ids", "endless", "quote", "echo_key")
FLAGS += ("no_model", "alternate", "no_cost", "no_token_ids")
FLAGS += ("args_surrogate", "content_surrogate", "bad_utf8", "gzip_bomb")
BROKEN_USAGE: dict[str, dict | list] = {
    "empty": {},
    "huge": {"prompt_tokens": 1e300, "completion_tokens": 1e300, "total_tokens": 1e300},
    "negative": {"prompt_tokens": -5, "completion_tokens": -5, "total_tokens": -10},
    "strings": {"prompt_tokens": "12", "completion_tokens": "5", "total_tokens": "17"},
    "list": [1, 2, 3],
}
DEEP = "__mock_deep__"  # where the server puts the text of a value nested `body_deep` levels
BAD_BYTE = "__mock_bad_byte__"  # where the server puts a byte that is not UTF-8
BY_TOKENS = "tokens"  # the server's default cost: a made-up price per token


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
    flagged: bool = False
    upstream_error: bool = False
    empty: bool = False
    snoop: bool = False
    command: str | None = None
    alternate: bool = False
    quote: bool = False
    echo_key: bool = False
    image: str = "b64"
    sleep: float = 0.0
    name_list: bool = False
    calls_string: bool = False
    args_number: bool = False
    no_ids: bool = False
    dup_ids: bool = False
    calls: int | None = None
    endless: bool = False
    trickle: float = 0.0
    huge_mb: float = 0.0
    gzip_bomb: bool = False
    overflow: str | None = None
    stop: str | None = None
    model: str | None = None
    no_model: bool = False
    cost: float | None = None
    no_cost: bool = False
    cached: int = 0
    no_token_ids: bool = False
    template: str = "append"
    ids: str = "vllm"
    args_deep: int = 0
    args_surrogate: bool = False
    content_surrogate: bool = False
    body_deep: int = 0
    bad_utf8: bool = False
    usage: str | None = None
    call: str | None = None

    @property
    def planned(self) -> list[list[tuple[str, dict]]] | None:
        """The turns of ``call=``, or None: the plan from the tools on offer."""
        if self.call is None:
            return None
        turns = []
        for item in self.call.split(","):
            name, _, arguments = item.partition(":")
            try:
                parsed = json.loads(unquote(arguments)) if arguments else {}
            except ValueError:
                raise DirectiveError(f"mock directive call={item}: its arguments are not JSON") from None
            turns.append([(name, parsed)])
        return turns

    @classmethod
    def parse(cls, prompt: str) -> Directives:
        """The directives of a prompt; an unknown word or a bad value raises DirectiveError naming it, so a
        misspelt directive fails its test instead of quietly testing the defaults."""
        found = cls()
        words = [word.partition("=") for match in DIRECTIVE.finditer(prompt) for word in match.group(1).split()]
        unknown = [key for key, _, _ in words if key not in KNOWN]
        if unknown:
            raise DirectiveError(f"unknown mock directive {', '.join(unknown)}; known: {' '.join(KNOWN)}")
        for key, equals, value in words:
            setattr(found, key, _value(key, bool(equals), value))
        return found


class DirectiveError(ValueError):
    """A ``[mock ...]`` directive the scripted model does not know, or a value it cannot take."""


NUMBERS: dict[str, type] = {key: int for key in ("turns", "fail", "times", "calls", "cached", "args_deep", "body_deep")}
NUMBERS |= {key: float for key in ("retry_after", "latency", "sleep", "trickle", "huge_mb", "cost")}
CHOICES = {
    "reasoning": ("reasoning", "reasoning_content", "reasoning_details", "all", "think", "scratchpad", "none"),
    "image": ("b64", "url"),
    "overflow": tuple(OVERFLOWS),
    "stop": ("length", "content_filter"),
    "template": ("append", "drift"),
    "ids": ("vllm", "llamacpp"),
    "usage": tuple(BROKEN_USAGE),
}
TEXTS = ("model", "command", "call")
KNOWN = sorted((*FLAGS, *NUMBERS, *CHOICES, *TEXTS))


def _value(key: str, equals: bool, value: str):
    """What one directive word (of a known key) sets its key to."""
    if key in FLAGS:
        if equals:
            raise DirectiveError(f"mock directive {key!r} takes no value (got {key}={value})")
        return True
    if not equals:
        raise DirectiveError(f"mock directive {key!r} needs a value ({key}=...)")
    if key in NUMBERS:
        try:
            return NUMBERS[key](value)
        except ValueError:
            raise DirectiveError(f"mock directive {key}={value}: not a number") from None
    if key in CHOICES and value not in CHOICES[key]:
        raise DirectiveError(f"mock directive {key}={value}: one of {', '.join(CHOICES[key])}")
    return unquote(value) if key == "command" else value


def _first_command(steer: Directives, messages: list[dict], session: int) -> str | None:
    """What a directive makes the first terminal call run instead of the planned command."""
    if steer.alternate and session % 2:
        return "echo not solving it this time"
    if steer.command is not None:
        return steer.command
    if steer.sleep:
        return f"sleep {steer.sleep:g}; echo awake"
    if steer.quote:
        return f"echo {shlex.quote(_preamble(messages))}"
    return "tr '\\0' ' ' < /proc/$PPID/cmdline" if steer.snoop else None


@dataclass
class Reply:
    """What the server sends back: an HTTP status with headers, or a chat message with usage."""

    status: int = 200
    headers: dict = field(default_factory=dict)
    message: dict = field(default_factory=dict)
    finish_reason: str = "stop"
    usage: dict | list = field(default_factory=dict)  # a list: the `usage=list` fault
    error: str = "injected fault"  # the message of a failure, or of an error inside a 200 choice
    empty: bool = False  # a 200 without any choice
    body: dict | None = None  # a failure's whole JSON body, as a given server sends it; None: a generic one
    endless: bool = False  # the reply never ends
    trickle: float = 0.0  # seconds between the bytes of the reply; 0: all at once
    deep: int = 0  # the reply carries a field nested this many levels (0: none)
    bad_utf8: bool = False  # the reply carries a byte that is not UTF-8
    bomb: bool = False  # the reply is a decompression bomb (gzip_bomb)


def prompt_text(messages: list[dict]) -> str:
    """The task: the last user message (earlier ones may be few-shot prefill)."""
    for message in reversed(messages):
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


def _plan(offered: set[str], prompt: str, site: str, seen: dict[str, dict]) -> list[list[tuple[str, dict]]]:
    """Tool calls per turn, from the tools on offer. How many turns depends on the offer alone; later
    turns use earlier results (`seen`: tool name -> its latest result), as a model would."""
    first: list[tuple[str, dict]] = []
    second: list[tuple[str, dict]] = []
    if "terminal" in offered:
        first.append(("terminal", {"command": "echo mock-model-was-here && pwd && ls -a"}))
    if "write_file" in offered:
        first.append(("write_file", {"path": "notes.txt", "content": f"Task: {prompt[:80]}\n"}))
        if "read_file" in offered:
            second.append(("read_file", {"path": "notes.txt"}))
    found = URL.search(prompt)
    url = found.group(0) if found else f"{site}/_mock/page"
    for name, arguments in (
        ("execute_code", {"code": "import sys\nprint(sum(range(10)))\nprint('done', file=sys.stderr)"}),
        ("web_search", {"query": DIRECTIVE.sub("", prompt).strip()[:80]}),
        ("web_extract", {"urls": [url]}),
        ("image_generate", {"prompt": f"an illustration of: {prompt[:60]}", "size": "256x256"}),
    ):
        if name in offered:
            first.append((name, arguments))
    if "vision_analyze" in offered:
        image = seen.get("image_generate", {}).get("path") or f"{site}/_mock/image.png"
        second.append(("vision_analyze", {"image_url": image, "question": "What does this image show?"}))
    plan = [first, second, [], []]
    if "browser_navigate" in offered and (found or ABOUT_A_PAGE.search(prompt) or "web_extract" not in offered):
        for turn, calls in zip(plan, _browse(url, seen), strict=True):
            turn.extend(calls)
    return [turn for turn in plan if turn]


def _browse(url: str, seen: dict[str, dict]) -> list[list[tuple[str, dict]]]:
    """Open the page, read it, fill in its first text field and press its first button, read the
    result, then scroll, press a key, go back and close the browser."""
    refs: dict[str, str] = {}
    for role, ref in SNAPSHOT_REF.findall(seen.get("browser_snapshot", {}).get("snapshot", "")):
        refs.setdefault(role, ref)
    act = [("browser_type", {"ref": refs["textbox"], "text": "mock"})] if "textbox" in refs else []
    act += [("browser_click", {"ref": refs["button"]})] if "button" in refs else []
    leave = [("browser_scroll", {"direction": "down"}), ("browser_press", {"key": "End"}), ("browser_back", {})]
    return [
        [("browser_navigate", {"url": url})],
        [("browser_snapshot", {})],
        [*act, ("browser_snapshot", {})],
        [*leave, ("browser_close", {})],
    ]


def _results_by_tool(messages: list[dict]) -> dict[str, dict]:
    """Tool name -> its latest result, matched through the call ids."""
    names = {
        call.get("id"): call.get("function", {}).get("name")
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
    }
    seen: dict[str, dict] = {}
    for message in messages:
        if message.get("role") == "tool":
            try:
                seen[str(names.get(message.get("tool_call_id")))] = json.loads(message.get("content") or "{}")
            except json.JSONDecodeError:
                continue
    return seen


def _image_part(messages: list[dict]) -> str | None:
    """The image URL of the last user message, when it carries one (a vision request)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            parts = message.get("content") if isinstance(message.get("content"), list) else []
            return next((p["image_url"]["url"] for p in parts if p.get("type") == "image_url"), None)
    return None


def _with_reasoning(kind: str, text: str, content: str) -> dict:
    message: dict[str, object] = {"role": "assistant", "content": content}
    if kind == "think":
        message["content"] = f"<think>{text}</think>\n{content}"
    elif kind == "scratchpad":
        message["content"] = f"<REASONING_SCRATCHPAD>{text}</REASONING_SCRATCHPAD>\n{content}"
    elif kind == "reasoning_details":
        message["reasoning_details"] = [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]
    elif kind in ("reasoning", "reasoning_content"):
        message[kind] = text
    elif kind == "all":  # as OpenRouter often does: the same reasoning in every field
        message.update(reasoning=text, reasoning_content=text)
        message["reasoning_details"] = [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]
    return message


def turn_of(messages: list[dict]) -> int:
    """Which turn of its session a request asks for: the assistant messages since the last user message."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return sum(1 for m in messages[users[-1] :] if m.get("role") == "assistant") if users else 0


def reply(
    request: dict,
    attempts: int,
    turns: int | None = None,
    site: str = "http://127.0.0.1",
    session: int = 0,
    cost=BY_TOKENS,
) -> tuple[Reply, float]:
    """The reply to one request and the extra latency before it. `attempts` counts earlier
    requests for the same prompt (fault directives with ``times`` use it); `turns` is the server's
    default number of tool-calling turns, which a prompt's own directive overrides; `site` is the
    mock server's own address (its page and image); `session` counts earlier sessions of the same
    prompt (``alternate`` uses it); `cost` what a reply reports as its cost unless the prompt says
    otherwise: BY_TOKENS, an amount in USD, or None for none."""
    messages = request.get("messages") or []
    if mock_judge.is_judge(request):  # asked to grade a sample (verification/judge.py): directives of its own
        message = {"role": "assistant", "content": mock_judge.verdict(request, attempts)}
        return Reply(message=message, usage=_usage(messages, message, "", cost)), 0.0
    prompt = prompt_text(messages)
    steer = Directives.parse(prompt)
    faulty = steer.times is None or attempts < steer.times
    fault = _fault(steer) if faulty else None
    if fault is not None:
        return fault
    image = _image_part(messages)
    if image:
        return _vision_reply(messages, prompt, image, cost), steer.latency

    offered = {tool["function"]["name"] for tool in request.get("tools") or []}
    since_prompt = messages[max(i for i, m in enumerate(messages) if m.get("role") == "user") :] if prompt else []
    plan = steer.planned or _plan(offered, prompt, site, _results_by_tool(since_prompt))
    turns = next((n for n in (steer.turns, turns) if n is not None), len(plan))
    turn = turn_of(messages) if prompt else 0
    if turn < turns and offered:
        message, thought = _calling(steer, messages, session, prompt, turn, plan, offered)
        finish = "tool_calls"
    else:
        results = [m for m in since_prompt if m.get("role") == "tool"]
        message, thought, finish = _answering(steer, messages, prompt, turn, results)
    return _sent(steer, faulty, messages, message, thought, finish, cost), steer.latency


def _fault(steer: Directives) -> tuple[Reply, float] | None:
    """The injected failure a prompt asks for (while it is still `faulty`), or None."""
    if steer.fail:
        headers = {} if steer.retry_after is None else {"Retry-After": f"{steer.retry_after:g}"}
        error = "Your input was flagged by moderation" if steer.flagged else "injected fault"
        return Reply(status=steer.fail, headers=headers, error=error), steer.latency
    if steer.overflow in OVERFLOWS:
        status, body = OVERFLOWS[steer.overflow]
        return Reply(status=status, body=body), steer.latency
    if steer.upstream_error:
        charged = {"cost": steer.cost} if steer.cost is not None else {}
        message = {"role": "assistant", "content": ""}
        return Reply(message=message, finish_reason="error", usage=charged, error="upstream"), 0.0
    if steer.empty:
        return Reply(empty=True), 0.0
    return None


def _calling(
    steer: Directives, messages: list[dict], session: int, prompt: str, turn: int, plan: list, offered: set[str]
) -> tuple[dict, str]:
    """A tool-calling turn: the assistant message with its calls (as the directives bend them), its thought."""
    calls = plan[turn] if turn < len(plan) else [_filler(offered, turn)]
    if turn == 0 and steer.calls is not None:
        calls = [_filler(offered, i) for i in range(steer.calls)]
    tool_calls = [_call(turn, i, name, args) for i, (name, args) in enumerate(calls)]
    if turn == 0 and steer.bad_json:
        tool_calls[0]["function"]["arguments"] = '{"command": "echo broken'
    command = _first_command(steer, messages, session) if turn == 0 else None
    if command is not None and tool_calls[0]["function"]["name"] == "terminal":
        tool_calls[0]["function"]["arguments"] = json.dumps({"command": command})
    if turn == 0 and steer.args_deep:
        nested = "[" * steer.args_deep + "]" * steer.args_deep
        tool_calls[0]["function"]["arguments"] = '{"command": ' + nested + "}"
    if turn == 0 and steer.args_surrogate:
        tool_calls[0]["function"]["arguments"] = '{"command": "echo \\ud800"}'
    if turn == 0 and steer.unknown_tool:
        tool_calls[0]["function"]["name"] = "hallucinated_tool"
    thought = f"Turn {turn + 1}: to make progress on '{prompt[:60]}' I will call " + ", ".join(
        name for name, _ in calls
    )
    thought += f" My instructions say: {_preamble(messages)}" if steer.quote else ""
    message = _with_reasoning(steer.reasoning, thought, "")
    message["tool_calls"] = _malformed(tool_calls, steer) if turn == 0 else tool_calls
    return message, thought


def _answering(
    steer: Directives, messages: list[dict], prompt: str, turn: int, results: list[dict]
) -> tuple[dict, str, str]:
    """The final answer: the assistant message, its thought and its finish reason."""
    seen = (results[-1].get("content") or "")[:200] if results else "nothing yet"
    thought = f"I have what I need after {turn} tool turns; the last result was: {seen[:80]}"
    answer = f"Here is my answer to '{prompt[:60]}'. The tools showed: {seen}"
    if steer.quote:
        thought += f" My instructions say: {_preamble(messages)}"
        answer += f" I was told: {_preamble(messages)}"
    finish = "stop"
    if steer.stop:  # cut off mid-word, as max_tokens or a content filter leaves an answer
        answer, finish = answer[: len(answer) // 2].rstrip(), steer.stop
    return _with_reasoning(steer.reasoning, thought, answer), thought, finish


def _sent(
    steer: Directives, faulty: bool, messages: list[dict], message: dict, thought: str, finish: str, cost
) -> Reply:
    """The reply as sent: its usage, and the faults a prompt asks of a reply that is otherwise fine."""
    if steer.huge_mb and faulty:
        message["content"] += "x" * int(steer.huge_mb * 2**20)
    reasoning = thought if steer.reasoning != "none" else ""
    usage: dict | list = _usage(messages, message, reasoning, _cost(steer, cost), steer.cached)
    if faulty:
        message["content"] += "\ud800" if steer.content_surrogate else ""
        usage = BROKEN_USAGE.get(steer.usage or "", usage)
    endless, trickle = steer.endless and faulty, steer.trickle if faulty else 0.0
    deep, bad = (steer.body_deep, steer.bad_utf8) if faulty else (0, False)
    reply = Reply(message=message, finish_reason=finish, usage=usage, endless=endless, trickle=trickle)
    reply.deep, reply.bad_utf8, reply.bomb = deep, bad, steer.gzip_bomb and faulty
    return reply


def _preamble(messages: list[dict]) -> str:
    """Every message before the prompt (the ephemeral system prompt, the prefill), as one text."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=0)
    return " | ".join(str(m.get("content") or "") for m in messages[:last])


def _malformed(tool_calls: list[dict], steer: Directives) -> list[dict] | str:
    """The first turn's calls as a broken or hostile server may send them."""
    if steer.name_list:
        tool_calls[0]["function"]["name"] = [tool_calls[0]["function"]["name"]]
    if steer.args_number:
        tool_calls[0]["function"]["arguments"] = 42
    for call in tool_calls:
        if steer.no_ids:
            del call["id"]
        elif steer.dup_ids:
            call["id"] = "call_dup"
    return json.dumps(tool_calls) if steer.calls_string else tool_calls


def _cost(steer: Directives, server_cost):
    """What a reply reports as its cost: the prompt's directive, else the server's setting."""
    if steer.cost is not None:
        return steer.cost
    return None if steer.no_cost else server_cost


def _usage(messages: list[dict], message: dict, reasoning: str, cost=BY_TOKENS, cached: int = 0) -> dict:
    prompt_tokens = sum(len(json.dumps(m)) for m in messages) // 4
    completion_tokens = len(json.dumps(message)) // 4
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": len(reasoning) // 4},
    }
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": min(cached, prompt_tokens)}
    if cost == BY_TOKENS:
        usage["cost"] = round((prompt_tokens + 4 * completion_tokens) * 1e-7, 8)
    elif cost is not None:
        usage["cost"] = cost
    return usage


def _vision_reply(messages: list[dict], question: str, image: str, cost=BY_TOKENS) -> Reply:
    if image.startswith("data:"):
        media_type, _, data = image[5:].partition(";base64,")
        what = f"the {media_type} image ({len(data) * 3 // 4} bytes)"
    else:
        what = f"the image at {image}"
    answer = f"(mock vision) To '{question[:80]}': {what} shows one flat colour, without text or objects."
    message = {"role": "assistant", "content": answer}
    return Reply(message=message, usage=_usage(messages, message, "", cost))


def image_reply(request: dict, site: str, cost=BY_TOKENS) -> dict:
    """An images API answer: a PNG of the requested size in a colour taken from the prompt, as base64
    data or, with ``[mock image=url]`` in the prompt, as a URL of the mock server's image."""
    prompt = str(request.get("prompt") or "")
    size = re.fullmatch(r"(\d+)x(\d+)", str(request.get("size") or ""))
    width, height = (min(int(n), 1024) for n in size.groups()) if size else (64, 64)
    if Directives.parse(prompt).image == "url":
        item = {"url": f"{site}/_mock/image.png"}
    else:
        colour = hashlib.md5(prompt.encode()).digest()[:3]
        item = {"b64_json": base64.b64encode(solid_png(width, height, colour)).decode()}
    tokens = len(prompt) // 4 + 1
    usage: dict[str, float] = {"input_tokens": tokens, "output_tokens": 256, "total_tokens": tokens + 256}
    if cost is not None:
        usage["cost"] = round((tokens + 4 * 256) * 1e-7, 8) if cost == BY_TOKENS else cost
    return {"created": int(time.time()), "data": [item | {"revised_prompt": prompt}], "usage": usage}


def zeros_gzip(megabytes: int) -> bytes:
    """A gzip stream of `megabytes` MB of zero bytes, about 1 KB per MB, made in milliseconds: one
    compressed MB repeated (each ends in a full flush, so none refers back into another), without the
    trailer, which no reader that stops at a cap ever reaches."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    header = compressor.compress(b"") + compressor.flush(zlib.Z_FULL_FLUSH)
    megabyte = compressor.compress(bytes(2**20)) + compressor.flush(zlib.Z_FULL_FLUSH)
    return header + megabyte * megabytes


def solid_png(width: int, height: int, rgb: bytes) -> bytes:
    """A valid PNG of one colour, written by hand so the mock needs no imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = (b"\x00" + bytes(rgb) * width) * height
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _filler(offered: set[str], turn: int) -> tuple[str, dict]:
    """The call for the extra turns asked for with ``turns=N`` beyond the plan."""
    if "terminal" in offered:
        return "terminal", {"command": f"echo step {turn + 1}"}
    if "read_file" in offered:
        return "read_file", {"path": "notes.txt"}
    return sorted(offered)[0], {}
