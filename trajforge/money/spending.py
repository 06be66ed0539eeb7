"""What a worker process asks of the money database before and after each model call, off its event
loop: the response cache, the budget, the rate limits, the shared pause after 429s and the adaptive
concurrency limit.

One Spending per worker process (each Ray task has its own), all of them on the same database in the
run folder (directly on the driver's machine, through the run's money actor from a Ray task:
ledger.py), so a budget or a limit holds for the whole run whatever --num_workers and --concurrency
are, on one machine or a cluster."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import orjson

from trajforge.money.bucket import Bucket
from trajforge.money.errors import CostUnknown, stop_for
from trajforge.money.ledger import ActorLedger, LocalLedger
from trajforge.money.pricing import tokens
from trajforge.money.reply_cost import billed, reply_usage
from trajforge.money.store import Call
from trajforge.safejson import dumps

Ledger = LocalLedger | ActorLedger
Overload = tuple[str, float | None]  # (rate_limited or overloaded, the seconds a 429 asked to wait)

SETTLE_POLL = 0.1  # seconds between looks when a call waits for the calls in flight to settle
SLOT_POLL = 0.05  # seconds between looks for a place another process's request freed


@dataclass(frozen=True)
class MoneySettings:
    folder: str = ""  # the run folder, absolute: where the database lives
    max_cost: float | None = None  # USD for the whole run folder, every invocation together
    max_cost_per_prompt: float | None = None
    max_tokens_per_prompt: int | None = None
    max_requests_per_minute: float | None = None
    max_tokens_per_minute: float | None = None
    cache: bool = True  # --no_cache turns the response cache off (paid calls are still counted)
    reservation_ttl: float = 3600.0  # seconds after which a call in flight no longer holds its reservation
    start: int = 1  # requests in flight per endpoint at most: --num_workers x --concurrency
    adaptive: bool = True  # --adaptive_concurrency: fewer in flight while the endpoint says it is overloaded

    @property
    def needs_cost(self) -> bool:
        """A cost limit is set: a reply without a known cost stops the run instead of running blind."""
        return self.max_cost is not None or self.max_cost_per_prompt is not None


def cache_key(endpoint: str, path: str, body: dict, scope: str) -> str:
    """The response cache's key of one request: the endpoint, the request body (model, messages, tools,
    sampling options) and the sample it belongs to (`scope`), never anything volatile."""
    canonical = {"endpoint": endpoint.rstrip("/"), "path": path, "body": body, "scope": scope}
    return hashlib.sha256(dumps(canonical, option=orjson.OPT_SORT_KEYS)).hexdigest()


def sample_scope(entry_key: str, occurrence: int, sample_index: int) -> str:
    """Which sample a call belongs to, the same on every invocation: the dataset entry (its content),
    which of its identical copies (`occurrence`) and which of its samples. It keeps two samples of
    one prompt from sharing replies and names the sample's workspace."""
    return hashlib.sha256(f"{entry_key}\0{occurrence}\0{sample_index}".encode()).hexdigest()[:16]


class Spending:
    def __init__(self, settings: MoneySettings, redact: Callable[[str], str] = str, ledger: Ledger | None = None):
        """`ledger`: how the run's money database is reached (ledger.py); by default opened here."""
        self.settings = settings
        self.redact = redact  # a cached reply is saved output: the run's secrets are masked in it
        self.ledger = ledger or LocalLedger(settings.folder)
        per_minute = Bucket.per_minute
        self.requests = per_minute(settings.max_requests_per_minute) if settings.max_requests_per_minute else None
        self.tokens = per_minute(settings.max_tokens_per_minute) if settings.max_tokens_per_minute else None
        self._queue = asyncio.Lock()  # made outside a loop: fine since Python 3.10
        self._freed = asyncio.Event()  # a request of this process has ended: a place may be free

    async def cached(self, key: str) -> tuple[dict, float | None] | None:
        """(stored reply, its cost) when this request was paid for before, counted as a hit."""
        if not self.settings.cache:
            return None
        found = await self.ledger("cached", key)
        return (orjson.loads(found[0]), found[1]) if found else None

    async def reserve(self, call: Call) -> int | None:
        """Room in the budget for `call`: a reservation to settle or release (None without --max_cost).
        Waits while calls in flight hold the room; raises BudgetReached when there is none, or the
        stop another call found."""
        if self.settings.max_cost is None:
            await self.check()
            return None
        while True:
            reservation = await self.ledger("reserve", call, self.settings.max_cost, self.settings.reservation_ttl)
            if reservation is not None:
                return reservation
            await asyncio.sleep(SETTLE_POLL)

    async def check(self) -> None:
        """Raise the run's stop, if a call found one: no further call starts."""
        stopped = await self.ledger("stopped")
        if stopped:
            raise stop_for(stopped)

    async def stopped(self) -> bool:
        return bool(await self.ledger("stopped"))

    async def admit(self, endpoint: str, tokens: float) -> None:
        """Wait for the request's turn under the run's rate limits and `endpoint`'s pause after 429s."""
        charge = tokens if self.tokens else 0.0
        wait = await self.ledger("admit", endpoint, self.requests, self.tokens, charge)
        if wait > 0:
            await asyncio.sleep(wait)

    @contextlib.asynccontextmanager
    async def slot(self, endpoint: str, overload: Callable[[BaseException], Overload | None]) -> AsyncIterator[None]:
        """One request to `endpoint` in flight, within its adaptive limit across the run's processes
        (without --adaptive_concurrency, at once). `overload(exc)` reads a failure: a 429 pauses every
        session of the endpoint (recorded before its place is free, so none goes meanwhile) and, with
        a 503 and the like, cuts the limit; a success raises it."""
        flight = await self._take(endpoint) if self.settings.adaptive else None
        outcome = "failed"
        try:
            yield
            outcome = "ok"
        except Exception as exc:
            found = overload(exc)
            if found is not None:
                outcome = "overloaded"
                if found[0] == "rate_limited":
                    await self.ledger("strike", endpoint, found[1], self.settings.start, self.settings.adaptive)
            raise
        finally:
            if flight is not None:
                await self.ledger("free_slot", flight, outcome)
                self._freed.set()

    async def _take(self, endpoint: str) -> int:
        async with self._queue:  # this process's next request waits at the head; the rest wait behind it
            while (flight := await self.ledger("take_slot", endpoint, self.settings.start)) is None:
                self._freed.clear()
                with contextlib.suppress(TimeoutError):  # another process's request may have ended meanwhile
                    await asyncio.wait_for(self._freed.wait(), SLOT_POLL)
        return flight

    async def pay(self, key: str, data: dict, cost: float | None, charged: float, endpoint: str) -> bool:
        """A reply as soon as it came, before anything of it is read: when the endpoint charges for it
        (reply_cost.billed), its cost into the ledger (the token bucket set right for the `charged`
        tokens taken before it) and the reply into the cache, in one transaction, so no kill -9 between
        the two pays for it again on --resume; whether it was charged. A reply then found bad is
        forgotten (forget); one not charged goes into the cache once it is read (keep)."""
        if not billed(data):
            return False
        used = tokens(reply_usage(data))["total_tokens"]
        stored, charged = self._stored(data), charged if self.tokens else 0.0
        await self.ledger("settle", key, stored, cost, used, charged, endpoint)
        return True

    async def keep(self, key: str, data: dict, cost: float | None) -> None:
        """A reply nobody charged for, read and found good: into the cache before it is used."""
        if self.settings.cache:
            await self.ledger("keep", key, self._stored(data), cost)

    async def forget(self, key: str) -> None:
        """A cached reply found bad: out of the cache, so the request is sent again."""
        await self.ledger("forget", key)

    def _stored(self, data: dict) -> bytes | None:
        """A reply as the cache keeps it (None with --no_cache): its secrets masked, what orjson cannot
        encode kept as text."""
        return self.redact(dumps(data).decode()).encode() if self.settings.cache else None

    async def release(self, reservation: int | None) -> None:
        if reservation is not None:
            await self.ledger("release", reservation)

    async def price_later(self, key: str, cost: float) -> None:
        await self.ledger("price_later", key, cost)

    async def stop_unknown_cost(self) -> None:
        await self.ledger("stop", CostUnknown.reason)

    async def close(self) -> None:
        await self.ledger.close()


class Spends(Protocol):
    """What the money wrapper (metered.py) asks around each call: Spending, or Unmetered."""

    settings: MoneySettings

    async def cached(self, key: str) -> tuple[dict, float | None] | None: ...
    async def reserve(self, call: Call) -> int | None: ...
    def slot(
        self, endpoint: str, overload: Callable[[BaseException], Overload | None]
    ) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def admit(self, endpoint: str, tokens: float) -> None: ...
    async def pay(self, key: str, data: dict, cost: float | None, charged: float, endpoint: str) -> bool: ...
    async def keep(self, key: str, data: dict, cost: float | None) -> None: ...
    async def forget(self, key: str) -> None: ...
    async def release(self, reservation: int | None) -> None: ...
    async def price_later(self, key: str, cost: float) -> None: ...
    async def stop_unknown_cost(self) -> None: ...


class Unmetered:
    """Spending that keeps no money: no cache, no budget, no limits, each reply still priced (the unit tests
    of the agent loop call the endpoint straight)."""

    settings = MoneySettings()

    async def cached(self, key: str) -> None:
        return None

    async def reserve(self, call: Call) -> None:
        return None

    def slot(self, endpoint: str, overload: Callable[[BaseException], Overload | None]) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    async def admit(self, endpoint: str, tokens: float) -> None:
        pass

    async def pay(self, key: str, data: dict, cost: float | None, charged: float, endpoint: str) -> bool:
        return False

    async def keep(self, key: str, data: dict, cost: float | None) -> None:
        pass

    async def forget(self, key: str) -> None:
        pass

    async def release(self, reservation: int | None) -> None:
        pass

    async def price_later(self, key: str, cost: float) -> None:
        pass

    async def stop_unknown_cost(self) -> None:
        pass


UNMETERED = Unmetered()
