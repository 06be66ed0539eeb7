"""The model client: one chat call over HTTP (plain or streamed), or any other request on the endpoint,
retried by the policy of model/retry.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
import httpx
import openai
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from trajforge.model.reply_size import ACCEPT_ENCODING, capper
from trajforge.model.retry import NOT_OURS, REFUSALS, BadReply, ModelCallFailed, ReplyTimeout, RunStopped, classify
from trajforge.model.stream import answer, assemble
from trajforge.tls import tls_context

T = TypeVar("T")


@dataclass(frozen=True)
class ModelSettings:
    model: str
    base_url: str
    api_key: str = field(repr=False)
    max_tokens: int | None = None
    extra_body: dict = field(default_factory=dict)  # OpenRouter `provider` and `reasoning` options
    request_timeout: float = 600.0  # seconds for a whole request: connecting and every byte of the reply
    max_retries: int = 6
    stream: bool = False


class ModelClient:
    def __init__(self, settings: ModelSettings):
        self.settings = settings
        self.client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key,
            max_retries=0,
            timeout=settings.request_timeout,  # per read: _attempt bounds the whole request
            default_headers=ACCEPT_ENCODING,
            http_client=openai.DefaultAioHttpClient(
                timeout=settings.request_timeout, event_hooks={"response": [capper()]}, verify=tls_context()
            ),
        )
        self._backoff = wait_random_exponential(multiplier=1, max=60)

    async def close(self) -> None:
        await self.client.close()

    def _wait(self, state) -> float:
        """As long as the server asked (Retry-After), else exponential backoff with jitter."""
        asked = classify(state.outcome.exception()).retry_after
        return asked if asked is not None else self._backoff(state)

    async def complete(self, messages: list[dict], tools: list[dict], log=None) -> tuple[dict, dict, int]:
        """(assistant message, usage, retries) for one model call, retried by our policy."""

        async def ask() -> tuple[dict, dict]:
            body = self._body(messages, tools)
            data = await (self._stream(body) if self.settings.stream else self.post_json("/chat/completions", body))
            usage = data.get("usage")
            return answer(data), usage if isinstance(usage, dict) else {}

        (message, usage), retries = await self.call(ask, log)
        return message, usage, retries

    async def call(self, request: Callable[[], Awaitable[T]], log=None) -> tuple[T, int]:
        """(result, retries) of `request()`, any call on this endpoint, retried by our policy. Raises
        RunStopped when the endpoint refuses us, ModelCallFailed when the call failed for good."""

        def before_sleep(state) -> None:
            if log:
                attempt = f"{state.attempt_number}/{self.settings.max_retries}"
                log(f"retry {attempt} in {state.upcoming_sleep:.1f}s", str(state.outcome.exception()))

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.settings.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception(lambda exc: classify(exc).retry),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    result = await self._attempt(request)
            return result, attempt.retry_state.attempt_number - 1
        except Exception as exc:
            decision = classify(exc)
            if decision.kind == NOT_OURS:
                raise
            if decision.stop_run:  # only ever an HTTP status
                status = exc.status_code
                raise RunStopped(f"{REFUSALS[status]} (HTTP {status} from {self.settings.base_url})") from exc
            raise ModelCallFailed(decision.kind, str(exc), attempt.retry_state.attempt_number) from exc

    async def _attempt(self, request: Callable[[], Awaitable[T]]) -> T:
        """One try of `request()`, within --request_timeout from connecting to the reply's last byte
        (the client's own timeout bounds each read alone, which a trickling stream never trips)."""
        seconds = self.settings.request_timeout
        try:
            async with asyncio.timeout(seconds) as limit:
                return await request()
        except TimeoutError:
            if not limit.expired():
                raise
            raise ReplyTimeout(f"no whole reply within {seconds:g}s (--request_timeout)") from None
        except openai.APIConnectionError as exc:
            if isinstance(exc.__cause__, BadReply):  # our size check, which the client took for a broken connection
                raise exc.__cause__ from None
            raise

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
        """A streamed reply, in the shape of a non-streamed one."""
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        stream = await self.client.post(
            "/chat/completions", body=body, cast_to=object, stream=True, stream_cls=openai.AsyncStream[object]
        )
        try:
            async with stream:
                chunks = [chunk async for chunk in stream]  # each a dict as it came; error events raise APIError
        except (aiohttp.ClientError, httpx.TransportError) as exc:  # cut off mid-stream
            raise BadReply(f"stream broken off: {type(exc).__name__}: {exc}") from exc
        except json.JSONDecodeError as exc:  # an event whose data is not JSON
            raise BadReply(f"stream carried data that is not JSON: {exc}") from exc
        return assemble(chunks)
