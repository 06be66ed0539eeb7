"""The retry policy: which failures of a model call are worth another try, which fail only the prompt and
which stop the whole run (the exceptions that carry those outcomes to the worker are model/outcomes.py's)."""

from __future__ import annotations

import math
import re
import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import aiohttp
import openai

from trajforge.errors import BadReply
from trajforge.model.outcomes import ReplyTimeout

RETRY_AFTER_CAP = 300.0  # seconds: a server asking for longer is not waited for beyond this
RETRIED_STATUSES = (408, 409, 429)  # and every 5xx
REFUSALS = {401: "the API key was refused", 402: "the account has no credits left", 403: "access was refused"}
NOT_OURS = "not_an_api_failure"  # the kind of anything else: a bug, which the worker reports as a crash
# How OpenAI, OpenRouter, vLLM, llama.cpp, Anthropic and Google say that the conversation does not fit
# (as a 400, 413 or 500, or inside a 200 or a stream's error event): waiting never makes it fit.
CONTEXT_OVERFLOW = re.compile(
    r"context[ _]?(length|size|window)|maximum context|prompt is too long|input is too long"
    r"|exceeds the maximum number of tokens",
    re.IGNORECASE,
)
CONTEXT_HINT = (
    "not retried: the conversation no longer fits in the model's context. To make it fit: lower --max_turns "
    "or --max_tokens, choose a --distribution with fewer tools (their schemas fill the context too), or, on a "
    "server whose sessions share one context (llama.cpp splits --ctx-size between its --parallel slots), run "
    "fewer sessions at once (--num_workers x --concurrency) or give the server a larger context"
)
# What a broken connection was, by the first of these found along the exception's causes; the client
# library wraps them (aiohttp in httpx in openai) and, for a refused connection, calls it a timeout.
CONNECTION_KINDS = (
    ("tls_failure", (ssl.SSLError, aiohttp.ClientSSLError), "TLS failure (is the URL https:// for an http:// server?)"),
    ("dns_failure", (socket.gaierror, aiohttp.ClientConnectorDNSError), "the host name could not be resolved"),
    ("connection_refused", (ConnectionRefusedError,), "connection refused (is the server running on that port?)"),
    (
        "connection_reset",
        (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, aiohttp.ServerDisconnectedError),
        "connection reset by the server",
    ),
    ("timeout", (TimeoutError,), "timed out"),
)


@dataclass(frozen=True)
class Decision:
    retry: bool
    stop_run: bool  # every further request of the run would fail the same way
    kind: str  # the error type in errors.jsonl, after "api_": http_429, context_length, connection_refused, ...
    retry_after: float | None = None  # seconds the server asked us to wait; None: our own backoff


def classify(exc: BaseException) -> Decision:
    """What to do about `exc` raised by a model call: retry rate limits, timeouts, conflicts, server
    errors, broken connections, error events in a stream and 200 replies without an answer (waiting
    as long as the server asks, within a cap); fail the prompt on other client errors (400, 404, 422),
    on a conversation too long for the model's context (in whatever form the server says it) and on a
    TLS failure; stop the run when the key, the credits or the access are refused."""
    if context_overflow(exc):
        return Decision(False, False, "context_length")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status in RETRIED_STATUSES or status >= 500:
            return Decision(True, False, f"http_{status}", retry_after(exc.response.headers))
        # OpenRouter answers 403 also for one input its moderation flagged: that fails only this prompt.
        flagged = status == 403 and any(word in str(exc).lower() for word in ("flagged", "moderation"))
        return Decision(False, status in REFUSALS and not flagged, f"http_{status}")
    if isinstance(exc, ReplyTimeout):
        return Decision(True, False, "timeout")
    if isinstance(exc, openai.APIConnectionError):  # a timeout among them
        kind = connection_kind(exc)
        return Decision(kind != "tls_failure", False, kind)  # a TLS setting or certificate does not heal
    if isinstance(exc, (openai.APIError, BadReply)):  # an error event in a stream, a reply we cannot read
        return Decision(True, False, "bad_reply")
    return Decision(False, False, NOT_OURS)


def overload(exc: BaseException) -> tuple[str, float | None] | None:
    """What a failed request says of the endpoint's load, for the shared pause and the adaptive
    concurrency limit: (`rate_limited`, the seconds of its Retry-After or None) for a 429,
    (`overloaded`, None) for a 503, Anthropic's 529 or an error that says "overloaded"; None for a
    failure that says nothing about how many requests the endpoint takes."""
    if isinstance(exc, openai.APIStatusError) and exc.status_code == 429:
        return "rate_limited", retry_after(exc.response.headers)
    if isinstance(exc, openai.APIStatusError) and exc.status_code in (503, 529):
        return "overloaded", None
    if isinstance(exc, (openai.APIError, BadReply)) and "overloaded" in str(exc).lower():
        return "overloaded", None
    return None


def context_overflow(exc: BaseException) -> bool:
    """Whether the server said that the conversation exceeds the model's context. A 429 never is
    (rate limits speak of tokens per minute), nor is a refusal of the key."""
    if isinstance(exc, openai.APIStatusError) and (exc.status_code in RETRIED_STATUSES or exc.status_code in REFUSALS):
        return False
    if not isinstance(exc, (openai.APIError, BadReply)) or isinstance(exc, openai.APIConnectionError):
        return False
    return bool(CONTEXT_OVERFLOW.search(str(exc)) or CONTEXT_OVERFLOW.search(str(getattr(exc, "body", ""))))


def _causes(outermost: BaseException) -> Iterator[BaseException]:
    """`outermost` and what it wraps, outermost first (each once: a chain may loop)."""
    seen: set[int] = set()
    exc: BaseException | None = outermost
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ if exc.__cause__ is not None or exc.__suppress_context__ else exc.__context__


def connection_kind(exc: BaseException) -> str:
    """tls_failure, dns_failure, connection_refused, connection_reset or timeout, from the real cause
    the client library wrapped; `connection` when none of them is found."""
    causes = list(_causes(exc))
    for kind, types, _ in CONNECTION_KINDS:
        if any(isinstance(cause, types) for cause in causes):
            return kind
    if any(isinstance(cause, openai.APITimeoutError) for cause in causes):
        return "timeout"
    return "connection"


def failure_message(exc: BaseException, kind: str) -> str:
    """What errors.jsonl and the screen say about a failed call: the server's words, with the way out
    for a context overflow; for a broken connection, what it was and the innermost cause (the client
    library's own words are "Connection error." or, for a refused connection, "Request timed out.")."""
    if kind == "context_length":
        return f"{exc} ({CONTEXT_HINT})"
    labels = {kind: label for kind, _, label in CONNECTION_KINDS}
    if (kind in labels or kind == "connection") and not isinstance(exc, ReplyTimeout):  # ours says it all
        *_, cause = _causes(exc)
        detail = str(cause) or type(cause).__name__
        return f"{labels.get(kind, 'connection error')}: {detail}"
    return str(exc)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (in seconds), capped; None when neither
    is a number (an HTTP date is not worth parsing: our own backoff serves as well)."""
    found = {name.lower(): value for name, value in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            seconds = float(found[name]) * scale
        except (KeyError, ValueError):
            continue
        if math.isfinite(seconds):
            return min(max(seconds, 0.0), RETRY_AFTER_CAP)
    return None
