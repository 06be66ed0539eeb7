"""The model client: one chat call over HTTP (plain or streamed), with its retry policy and usage."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
import httpx
import openai
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens")
STOP_RUN = {401: "the API key was refused", 402: "the account has no credits left", 403: "access was refused"}
RETRY_AFTER_CAP = 300.0
T = TypeVar("T")


@dataclass(frozen=True)
class ModelSettings:
    model: str
    base_url: str
    api_key: str = field(repr=False)
    max_tokens: int | None = None
    extra_body: dict = field(default_factory=dict)  # OpenRouter `provider` and `reasoning` options
    request_timeout: float = 600.0
    max_retries: int = 6
    stream: bool = False


class RunStopped(Exception):
    """The endpoint refused us (401/402/403): every further request would fail too."""


class BadReply(Exception):
    """A 200 answer without a usable choice (OpenRouter sends upstream errors this way)."""


class ModelCallFailed(Exception):
    def __init__(self, kind: str, message: str, attempts: int):
        super().__init__(message)
        self.kind, self.attempts = kind, attempts


def transient(exc: BaseException) -> bool:
    """Worth another try: rate limits, server errors, broken connections, error events in a stream
    and 200 replies that carry no answer."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return isinstance(exc, (openai.APIError, BadReply))


def _stops_the_run(exc: openai.APIStatusError) -> bool:
    # OpenRouter answers 403 also for one input its moderation flagged: that fails only this prompt.
    flagged = exc.status_code == 403 and any(word in str(exc).lower() for word in ("flagged", "moderation"))
    return exc.status_code in STOP_RUN and not flagged


def _answer(data: dict) -> dict:
    """The reply's message, or BadReply when a 200 carries an error instead (OpenRouter reports
    upstream failures this way, in the body or in the choice)."""
    choices = _dicts(data.get("choices"))
    choice = choices[0] if choices else {}
    if choice.get("error") or choice.get("finish_reason") == "error" or not isinstance(choice.get("message"), dict):
        problem = choice.get("error") or data.get("error") or data
        raise BadReply(f"reply without an answer: {json.dumps(problem)[:300]}")
    return choice["message"]


def _retry_after(exc: BaseException | None) -> float | None:
    headers = exc.response.headers if isinstance(exc, openai.APIStatusError) else {}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return min(float(headers[name]) * scale, RETRY_AFTER_CAP)
        except (KeyError, ValueError):
            continue
    return None


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"http_{exc.status_code}"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    return "connection" if isinstance(exc, openai.APIConnectionError) else "bad_reply"


class ModelClient:
    def __init__(self, settings: ModelSettings):
        self.settings = settings
        self.client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key,
            max_retries=0,
            timeout=settings.request_timeout,
            http_client=openai.DefaultAioHttpClient(timeout=settings.request_timeout),
        )
        self._backoff = wait_random_exponential(multiplier=1, max=60)

    async def close(self) -> None:
        await self.client.close()

    def _wait(self, state) -> float:
        retry_after = _retry_after(state.outcome.exception())
        return retry_after if retry_after is not None else self._backoff(state)

    async def complete(self, messages: list[dict], tools: list[dict], log=None) -> tuple[dict, dict, int]:
        """(assistant message, usage, retries) for one model call, retried by our policy."""

        async def ask() -> tuple[dict, dict]:
            body = self._body(messages, tools)
            data = await (self._stream(body) if self.settings.stream else self.post_json("/chat/completions", body))
            usage = data.get("usage")
            return _answer(data), usage if isinstance(usage, dict) else {}

        (message, usage), retries = await self.call(ask, log)
        return message, usage, retries

    async def call(self, request: Callable[[], Awaitable[T]], log=None) -> tuple[T, int]:
        """(result, retries) of `request()`, any call on this endpoint, retried by our policy."""

        def before_sleep(state) -> None:
            if log:
                attempt = f"{state.attempt_number}/{self.settings.max_retries}"
                log(f"retry {attempt} in {state.upcoming_sleep:.1f}s", str(state.outcome.exception()))

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.settings.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception(transient),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    result = await request()
            return result, attempt.retry_state.attempt_number - 1
        except openai.APIStatusError as exc:
            if _stops_the_run(exc):
                reason = STOP_RUN[exc.status_code]
                raise RunStopped(f"{reason} (HTTP {exc.status_code} from {self.settings.base_url})") from exc
            raise ModelCallFailed(_error_kind(exc), str(exc), attempt.retry_state.attempt_number) from exc
        except (openai.APIError, BadReply) as exc:
            raise ModelCallFailed(_error_kind(exc), str(exc), attempt.retry_state.attempt_number) from exc

    def _body(self, messages: list[dict], tools: list[dict]) -> dict:
        body = {"model": self.settings.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if self.settings.max_tokens:
            body["max_tokens"] = self.settings.max_tokens
        return body | self.settings.extra_body

    async def post_json(self, path: str, body: dict) -> dict:
        """POST `body` to the endpoint and return the JSON answer.

        The client's low-level post keeps its auth, URLs and error types but skips re-validating the
        request and building pydantic models (most of its CPU time, and a second of imports in every
        worker the first time a typed resource is used), and keeps provider fields such as `reasoning`
        as they came."""
        response = await self.client.post(path, body=body, cast_to=httpx.Response)
        try:
            data = json.loads(response.content)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise BadReply(f"reply is not a JSON object: {response.text[:200]!r}")
        return data

    async def _stream(self, body: dict) -> dict:
        """Assemble a streamed reply into the shape of a non-streamed one."""
        message: dict = {"role": "assistant", "content": ""}
        calls: dict[int, dict] = {}
        details: dict[int, dict] = {}
        data: dict = {"choices": [{"message": message}]}
        answered = False
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        stream = await self.client.post(
            "/chat/completions", body=body, cast_to=object, stream=True, stream_cls=openai.AsyncStream[object]
        )
        try:
            async with stream:
                async for chunk in stream:  # each a dict as it came; error events raise openai.APIError
                    if not isinstance(chunk, dict):
                        continue
                    data["usage"] = chunk.get("usage") or data.get("usage")
                    for choice in _dicts(chunk.get("choices")):
                        answered = True
                        data["choices"][0].update({k: choice[k] for k in ("finish_reason", "error") if choice.get(k)})
                        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
                        for key in ("content", "reasoning", "reasoning_content"):
                            if isinstance(delta.get(key), str):
                                message[key] = message.get(key, "") + delta[key]
                        for part in _dicts(delta.get("reasoning_details")):
                            _merge_fragment(details, part.get("index"), part, ("text", "summary", "signature", "data"))
                        for part in _dicts(delta.get("tool_calls")):
                            _merge_call(calls, part)
        except (aiohttp.ClientError, httpx.TransportError) as exc:  # cut off mid-stream
            raise BadReply(f"stream broken off: {type(exc).__name__}: {exc}") from exc
        except json.JSONDecodeError as exc:  # an event whose data is not JSON
            raise BadReply(f"stream carried data that is not JSON: {exc}") from exc
        if not answered:
            raise BadReply("stream ended without any choice")
        if details:
            message["reasoning_details"] = [details[i] for i in sorted(details)]
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return data


def _dicts(value) -> list[dict]:
    """The objects of a list from the wire; anything else a server sends there is ignored."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _merge_fragment(merged: dict[int, dict], index: int | None, part: dict, text_keys: tuple[str, ...]) -> None:
    """Streams send a piece of one item per chunk: join its text fields, keep its other fields."""
    index = len(merged) if index is None else index
    item = merged.setdefault(index, {})
    for key, value in part.items():
        if key in text_keys and isinstance(value, str):
            item[key] = item.get(key, "") + value
        elif value is not None and key not in text_keys:
            item[key] = value


def _merge_call(calls: dict[int, dict], part: dict) -> None:
    index = part.get("index")
    if index is None:  # some servers leave it out: a new id starts a new call, else the last one goes on
        known = [i for i, call in calls.items() if call["id"] and call["id"] == part.get("id")]
        index = known[0] if known else (len(calls) if part.get("id") or not calls else max(calls))
    call = calls.setdefault(index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call["id"] = part.get("id") or call["id"]
    function = part.get("function") if isinstance(part.get("function"), dict) else {}
    for key in ("name", "arguments"):
        if isinstance(function.get(key), str):
            call["function"][key] += function[key]


def empty_usage() -> dict:
    return dict.fromkeys(USAGE_KEYS, 0) | {"cost": 0.0}


def add_usage(total: dict, usage: dict) -> None:
    details = usage.get("completion_tokens_details") or {}
    for key in USAGE_KEYS:
        total[key] += int(usage.get(key) or details.get(key) or 0)
    total["cost"] += float(usage.get("cost") or 0.0)
