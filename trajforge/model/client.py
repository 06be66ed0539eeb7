"""The model client: one chat call over HTTP (plain or streamed), or any other request on the endpoint,
retried by the policy of model/retry.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
import httpx
import openai
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from trajforge.model.reply_body import UnreadableReply, decode, readable
from trajforge.model.reply_size import ACCEPT_ENCODING, capper
from trajforge.model.retry import (
    NOT_OURS,
    REFUSALS,
    BadReply,
    ModelCallFailed,
    ReplyTimeout,
    RunStopped,
    classify,
    failure_message,
)
from trajforge.model.served import served_models
from trajforge.model.settings import ModelSettings
from trajforge.model.stream import answer, assemble, finish_reason, reported
from trajforge.model.tokens import REQUEST, TokensMissing, lacks_ids, turn_tokens
from trajforge.money.errors import CostUnknown
from trajforge.money.reply_cost import reply_cost, reply_usage
from trajforge.money.spending import Spending, cache_key
from trajforge.money.store import Call
from trajforge.safejson import dumps
from trajforge.tls import tls_context

T = TypeVar("T")
PROBE_TIMEOUT = 30.0  # seconds at most for the check that the endpoint answers at all
OnRetry = Callable[[str, str], None]  # (kind, message) of a failed attempt that will be tried again


@dataclass(frozen=True)
class Completion:
    """One model call's answer."""

    message: dict  # the assistant message
    usage: dict
    retries: int
    finish_reason: str = ""  # as the server said it: stop, tool_calls, length, content_filter; "" when none
    model: str = ""  # the model name the server reports in its reply; "" when none
    tokens: dict | None = None  # with --token_ids: {prompt_token_ids, token_ids, logprobs}, None where missing
    tokens_missing: str = ""  # with --token_ids: what the reply lacked, or ""


class ModelClient:
    """Model calls through the response cache, the budget and the rate limits of `spending` (None: straight
    to the endpoint, as unit tests of the loop want)."""

    def __init__(self, settings: ModelSettings, spending: Spending | None = None):
        self.settings = settings
        self.spending = spending
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

    async def complete(
        self, messages: list[dict], tools: list[dict], log=None, on_retry: OnRetry | None = None, scope: str = ""
    ) -> Completion:
        """One model call of the sample `scope` (its usage with its cost), retried by our policy."""
        wire = {"usage": {"include": True}} if self.settings.openrouter else {}  # OpenRouter reports cost when asked

        async def post(body: dict) -> dict:
            body = body | wire
            return await (self._stream(body) if self.settings.stream else self.post_json("/chat/completions", body))

        def check(data: dict) -> None:
            answer(data)  # a 200 without an answer is retried (once paid for), never cached

        body = self._body(messages, tools)
        data, cost, retries = await self.paid(
            "/chat/completions", body, scope, post, self.settings.prices, log, on_retry, check
        )
        tokens, missing = turn_tokens(data) if self.settings.token_ids != "off" else (None, "")
        if self.settings.token_ids == "required" and lacks_ids(tokens):
            raise TokensMissing(f"{self.settings.base_url}: {missing}")
        usage = reply_usage(data) | {"cost": cost}
        return Completion(answer(data), usage, retries, finish_reason(data), reported(data), tokens, missing)

    async def paid(
        self,
        path: str,
        body: dict,
        scope: str,
        post: Callable[[dict], Awaitable[dict]],
        prices,
        log=None,
        on_retry: OnRetry | None = None,
        check: Callable[[dict], None] = lambda data: None,
    ) -> tuple[dict, float | None, int]:
        """(reply, its cost, retries) of the request `body` to `path`: from the response cache when it
        was paid for before (retries 0), else sent by `post` within the budget and the rate limits.
        Money first: each reply's cost goes into the ledger as soon as it arrives, before `check`
        (BadReply: tried again) reads it; a good reply is cached before it is used. CostUnknown when
        a cost limit is set and nobody knows a reply's cost."""
        size = len(dumps(body)) // 4  # a request's tokens, roughly: enough to reserve, to pace, to believe usage
        max_tokens = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else None
        spending = self.spending
        if spending is None:
            data, retries = await self.call(lambda: _checked(post(body), check), log, on_retry)
            return data, reply_cost(data, prices, size, max_tokens), retries
        key = cache_key(self.settings.cache_as or self.settings.base_url, path, body, scope)
        hit = await spending.cached(key)
        if hit is not None:
            data, cost = hit
            if cost is None:  # paid while nobody knew its cost: priced now, if prices were given since
                cost = reply_cost(data, prices, size, max_tokens)
                if cost is not None:
                    await spending.price_later(key, cost)
                else:
                    await self._cost_unknown(body)
            return data, cost, 0
        charged = size + (max_tokens or 0)
        reservation = await spending.reserve(Call(size, max_tokens, prices))

        async def attempt() -> tuple[dict, float | None]:
            await spending.admit(charged)
            data = await post(body)
            cost = reply_cost(data, prices, size, max_tokens)
            charged_for = await spending.pay(key, data, cost, charged)  # money first: before it is read
            try:
                check(data)
            except BadReply:
                if cost is None and charged_for:
                    await self._cost_unknown(body)
                raise
            await spending.keep(key, data, cost)
            return data, cost

        try:
            (data, cost), retries = await self.call(attempt, log, on_retry)
        finally:
            await spending.release(reservation)
        if cost is None:
            await self._cost_unknown(body)
        return data, cost, retries

    async def _cost_unknown(self, body: dict) -> None:
        """A reply without a cost: CostUnknown (the run stops) when a cost limit needs every cost."""
        if self.spending.settings.needs_cost:
            await self.spending.stop_unknown_cost()
            raise CostUnknown(f"{body.get('model')} at {self.settings.base_url} reported no cost")

    async def call(
        self,
        request: Callable[[], Awaitable[T]],
        log=None,
        on_retry: OnRetry | None = None,
    ) -> tuple[T, int]:
        """(result, retries) of `request()`, any call on this endpoint, retried by our policy; `on_retry`
        hears of each failed attempt that is tried again. Raises RunStopped when the endpoint refuses us,
        ModelCallFailed when the call failed for good."""

        def before_sleep(state) -> None:
            exc = state.outcome.exception()
            decision = classify(exc)
            kind = decision.kind
            if self.spending and kind == "http_429":  # every session of the run backs off
                self.spending.rate_limited(decision.retry_after)
            if on_retry:
                on_retry(kind, failure_message(exc, kind))
            if log:
                attempt = f"{state.attempt_number}/{self.settings.max_retries}"
                log(f"retry {attempt} in {state.upcoming_sleep:.1f}s", failure_message(exc, kind))

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
            message = failure_message(exc, decision.kind)
            raise ModelCallFailed(decision.kind, message, attempt.retry_state.attempt_number) from exc

    async def unreachable(self) -> tuple[str | None, list[str] | None]:
        """(None when the endpoint answers HTTP at all (any status: a 404 for GET /models too, since not
        every server has it), else what kept it from answering, as failure_message says it; the model ids
        GET /models listed, or None)."""
        try:
            async with asyncio.timeout(min(self.settings.request_timeout, PROBE_TIMEOUT)):
                response = await self.client.get("/models", cast_to=httpx.Response)
        except openai.APIStatusError:
            return None, None
        except (openai.APIConnectionError, TimeoutError) as exc:
            kind = classify(exc).kind if isinstance(exc, openai.APIConnectionError) else "timeout"
            return failure_message(exc, kind), None
        try:
            return None, served_models(response.json())
        except ValueError:  # not JSON: a server that answers, without a list to compare
            return None, None

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
        return body | self.settings.extra_body | (REQUEST if self.settings.token_ids != "off" else {})

    async def post_json(self, path: str, body: dict) -> dict:
        """POST `body` to the endpoint and return the JSON answer.

        The client's low-level post keeps its auth, URLs and error types but skips re-validating the
        request and building pydantic models (most of its CPU time, and a second of imports in every
        worker the first time a typed resource is used), and keeps provider fields such as `reasoning`
        as they came."""
        response = await self.client.post(path, body=body, cast_to=httpx.Response)
        return decode(response.content)

    async def _stream(self, body: dict) -> dict:
        """A streamed reply, in the shape of a non-streamed one."""
        body = body | {"stream": True, "stream_options": {"include_usage": True}}
        stream = await self.client.post(
            "/chat/completions", body=body, cast_to=object, stream=True, stream_cls=openai.AsyncStream[object]
        )
        try:
            async with stream:
                chunks = [chunk async for chunk in stream]  # each a dict as it came; error events raise APIError
        except (aiohttp.ClientError, httpx.TransportError) as exc:  # cut off mid-stream
            raise BadReply(f"stream broken off: {type(exc).__name__}: {exc}") from exc
        except (ValueError, RecursionError) as exc:  # an event that is not UTF-8 or JSON, or nested too deep
            raise UnreadableReply(f"stream carried data that is not JSON we can read: {exc!r:.300}") from None
        return readable(assemble(chunks))


def endpoint_problem(settings: ModelSettings) -> tuple[str | None, list[str] | None]:
    """One cheap check, before any prompt is sent, that the endpoint answers at all, and the models it
    lists (see unreachable)."""

    async def probe() -> tuple[str | None, list[str] | None]:
        client = ModelClient(settings)
        try:
            return await client.unreachable()
        finally:
            await client.close()

    return asyncio.run(probe())


async def _checked(reply: Awaitable[dict], check: Callable[[dict], None]) -> dict:
    data = await reply
    check(data)
    return data
