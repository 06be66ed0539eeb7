"""The exceptions that carry a model call's outcome to the worker: a reply that did not come in time, a run
the endpoint stopped, a call that failed for good. Apart from the retry policy (model/retry.py) and without
its imports (openai, aiohttp), so that the flags' checks (verification/judge.py) and the worker name them at
no cost to batch_runner.py's start."""

from __future__ import annotations


class ReplyTimeout(Exception):
    """No whole reply within --request_timeout: a server that stalls or trickles a stream."""


class RunStopped(Exception):
    """The endpoint refused us (401/402/403): every further request would fail too."""


class ModelCallFailed(Exception):
    """A model call that failed for good: not worth (another) retry, or out of retries."""

    def __init__(self, kind: str, message: str, attempts: int):
        super().__init__(message)
        self.kind, self.attempts = kind, attempts
