"""The retry policy: which failures of a model call are worth another try, which fail only the prompt and
which stop the whole run; and the exceptions that carry those outcomes to the worker."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import openai

RETRY_AFTER_CAP = 300.0  # seconds: a server asking for longer is not waited for beyond this
RETRIED_STATUSES = (408, 409, 429)  # and every 5xx
REFUSALS = {401: "the API key was refused", 402: "the account has no credits left", 403: "access was refused"}
NOT_OURS = "not_an_api_failure"  # the kind of anything else: a bug, which the worker reports as a crash


@dataclass(frozen=True)
class Decision:
    retry: bool
    stop_run: bool  # every further request of the run would fail the same way
    kind: str  # the error type in errors.jsonl, after "api_": http_429, timeout, connection, bad_reply
    retry_after: float | None = None  # seconds the server asked us to wait; None: our own backoff


class BadReply(Exception):
    """A 200 answer without a usable choice (OpenRouter sends upstream errors this way), a stream cut
    off or carrying data that is not JSON, a reply too large to keep."""


class ReplyTimeout(Exception):
    """No whole reply within --request_timeout: a server that stalls or trickles a stream."""


class RunStopped(Exception):
    """The endpoint refused us (401/402/403): every further request would fail too."""


class ModelCallFailed(Exception):
    """A model call that failed for good: not worth (another) retry, or out of retries."""

    def __init__(self, kind: str, message: str, attempts: int):
        super().__init__(message)
        self.kind, self.attempts = kind, attempts


def classify(exc: BaseException) -> Decision:
    """What to do about `exc` raised by a model call: retry rate limits, timeouts, conflicts, server
    errors, broken connections, error events in a stream and 200 replies without an answer (waiting
    as long as the server asks, within a cap); fail the prompt on other client errors (400, 404, 422);
    stop the run when the key, the credits or the access are refused."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status in RETRIED_STATUSES or status >= 500:
            return Decision(True, False, f"http_{status}", retry_after(exc.response.headers))
        # OpenRouter answers 403 also for one input its moderation flagged: that fails only this prompt.
        flagged = status == 403 and any(word in str(exc).lower() for word in ("flagged", "moderation"))
        return Decision(False, status in REFUSALS and not flagged, f"http_{status}")
    if isinstance(exc, (openai.APITimeoutError, ReplyTimeout)):
        return Decision(True, False, "timeout")
    if isinstance(exc, openai.APIConnectionError):
        return Decision(True, False, "connection")
    if isinstance(exc, (openai.APIError, BadReply)):  # an error event in a stream, a reply we cannot read
        return Decision(True, False, "bad_reply")
    return Decision(False, False, NOT_OURS)


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
