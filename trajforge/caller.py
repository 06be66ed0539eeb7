"""Who a model call is made for: one Caller per sample, made where the sample starts and handed to every
call made for it (the agent's, its tools', its judge's), instead of a scope, a log and a retry listener
travelling separately through every layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Whom a call tells of a failed attempt that will be tried again: (kind, message); the worker makes it an event.
OnRetry = Callable[[str, str], None]
Log = Callable[[str, str], None]  # (label, text): a line of --verbose output


@dataclass(frozen=True)
class Caller:
    scope: str = ""  # the sample: the response cache keys its calls by it, so no two samples share a reply
    log: Log | None = None  # --verbose: the sample's lines
    on_retry: OnRetry | None = None  # told of each attempt tried again (a progress event)


NOBODY = Caller()  # a call made for no sample: the endpoint check, unit tests
