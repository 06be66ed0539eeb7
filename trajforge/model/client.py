"""The model client: one chat call over HTTP (plain or streamed), or any other request on the endpoint,
retried by the policy of model/retry.py. HTTP and retries only: the response cache, the prices, the
budget and the rate limits wrap its sends from outside (money/metered.py), and no money module is
imported here."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import aiohttp
import httpx
import openai
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from trajforge.caller import NOBODY, Caller
from trajforge.model.outcomes import ModelCallFailed, ReplyTimeout, RunStopped
from trajforge.model.post import LeanPost, ThroughOpenAI
from trajforge.model.reply_body import UnreadableReply, decode, readable
from trajforge.model.reply_size import ACCEPT_ENCODING, capper
from trajforge.model.retry import NOT_OURS, REFUSALS, BadReply, classify, failure_message
from trajforge.model.retry import overload as load_of
from trajforge.model.served import served_models
from trajforge.model.settings import ModelSettings
from trajforge.model.stream import assemble
from trajforge.tls import tls_context

T = TypeVar("T")
PROBE_TIMEOUT = 30.0  # seconds at most for the check that the endpoint answers at all


class ModelClient:
    """HTTP to the endpoint and the retry policy, nothing else: what a request costs, whether it was
    answered before and whether it may go now is the money wrapper's (money/metered.py)."""

    @staticmethod
    def overload(exc: BaseException) -> tuple[str, float | None] | None:
        """What a failure says of the endpoint's load, for the money's concurrency limit (retry.overload)."""
        return load_of(exc)

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
        self._lean = LeanPost(self.client)
        self._backoff = wait_random_exponential(multiplier=1, max=60)

    async def close(self) -> None:
        await self.client.close()

    def _wait(self, state) -> float:
        """As long as the server asked (Retry-After), else exponential backoff with jitter."""
        asked = classify(state.outcome.exception()).retry_after
        return asked if asked is not None else self._backoff(state)

    async def post_chat(self, body: dict) -> dict:
        """One try of a chat request `body`: its reply, streamed or not, in the shape of a plain one."""
        if self.settings.openrouter:  # OpenRouter reports cost when asked (not part of the request's identity)
            body = body | {"usage": {"include": True}}
        return await (self._stream(body) if self.settings.stream else self.post_json("/chat/completions", body))

    async def call(
        self,
        request: Callable[[], Awaitable[T]],
        caller: Caller = NOBODY,
    ) -> tuple[T, int]:
        """(result, retries) of `request()`, any call on this endpoint, retried by our policy; the `caller`
        hears of each failed attempt that is tried again (a 429's pause for the other sessions is
        the money wrapper's). Raises RunStopped when the endpoint refuses us, ModelCallFailed when the
        call failed for good."""

        try:  # most calls: the first try answers, without tenacity's machinery (its CPU is a tenth of a call's)
            return await self._attempt(request), 0
        except Exception as exc:
            failed = [exc]

        async def again() -> T:
            """Tenacity's first attempt is the one that just failed: the same exception, the same policy."""
            if failed:
                raise failed.pop()
            return await self._attempt(request)

        def before_sleep(state) -> None:
            exc = state.outcome.exception()
            decision = classify(exc)
            kind = decision.kind
            if caller.on_retry:
                caller.on_retry(kind, failure_message(exc, kind))
            if caller.log:
                attempt = f"{state.attempt_number}/{self.settings.max_retries}"
                caller.log(f"retry {attempt} in {state.upcoming_sleep:.1f}s", failure_message(exc, kind))

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
                    result = await again()
            return result, attempt.retry_state.attempt_number - 1
        except Exception as exc:
            decision = classify(exc)
            if decision.kind == NOT_OURS:
                raise
            if decision.stop_run:  # only ever an HTTP status
                status = cast(openai.APIStatusError, exc).status_code
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

    async def post_json(self, path: str, body: dict) -> dict:
        """POST `body` to the endpoint and return the JSON answer.

        The client's low-level post keeps its auth, URLs and error types but skips re-validating the
        request and building pydantic models (most of its CPU time, and a second of imports in every
        worker the first time a typed resource is used), and keeps provider fields such as `reasoning`
        as they came. Sent by LeanPost where it reproduces openai's send exactly (most of the rest of the CPU
        time), else by the client."""
        try:
            content = await self._lean(path, body)
        except ThroughOpenAI:
            content = (await self.client.post(path, body=body, cast_to=httpx.Response)).content
        return decode(content)

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
