"""What a worker process asks of the money database before and after each model call, off its event
loop: the response cache, the budget, the rate limits and the shared pause after 429s.

One Spending per worker process (each Ray task on this machine has its own), all of them on the same
database in the run folder, so a budget or a rate limit holds for the whole run whatever
--num_workers and --concurrency are."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson

from trajforge.money.bucket import Bucket
from trajforge.money.errors import BudgetReached, CostUnknown
from trajforge.money.pricing import tokens
from trajforge.money.reply_cost import billed, reply_usage
from trajforge.money.store import Call, Store
from trajforge.safejson import dumps

SETTLE_POLL = 0.1  # seconds between looks when a call waits for the calls in flight to settle


@dataclass(frozen=True)
class MoneySettings:
    folder: str = ""  # the run folder, absolute: where the database lives
    host: str = ""  # the machine that started the run: only its processes use the database (SQLite over a
    # network filesystem, between machines, is not safe)
    max_cost: float | None = None  # USD for the whole run folder, every invocation together
    max_cost_per_prompt: float | None = None
    max_tokens_per_prompt: int | None = None
    max_requests_per_minute: float | None = None
    max_tokens_per_minute: float | None = None
    cache: bool = True  # --no_cache turns the response cache off (paid calls are still counted)
    reservation_ttl: float = 3600.0  # seconds after which a call in flight no longer holds its reservation

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
    def __init__(self, settings: MoneySettings, redact: Callable[[str], str] = str):
        self.settings = settings
        self.redact = redact  # a cached reply is saved output: the run's secrets are masked in it
        self.store = Store(Path(settings.folder))
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="money")  # one connection, used in order
        per_minute = Bucket.per_minute
        self.requests = per_minute(settings.max_requests_per_minute) if settings.max_requests_per_minute else None
        self.tokens = per_minute(settings.max_tokens_per_minute) if settings.max_tokens_per_minute else None

    async def _run(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, function, *args)

    async def cached(self, key: str) -> tuple[dict, float | None] | None:
        """(stored reply, its cost) when this request was paid for before, counted as a hit."""
        if not self.settings.cache:
            return None
        found = await self._run(self.store.cached, key)
        return (orjson.loads(found[0]), found[1]) if found else None

    async def reserve(self, call: Call) -> int | None:
        """Room in the budget for `call`: a reservation to settle or release (None without --max_cost).
        Waits while calls in flight hold the room; raises BudgetReached when there is none, or the
        stop another call found."""
        if self.settings.max_cost is None:
            await self.check()
            return None
        while True:
            reservation = await self._run(
                self.store.reserve, call, self.settings.max_cost, self.settings.reservation_ttl
            )
            if reservation is not None:
                return reservation
            await asyncio.sleep(SETTLE_POLL)

    async def check(self) -> None:
        """Raise the run's stop, if a call found one: no further call starts."""
        stopped = await self._run(self.store.stopped)
        if stopped:
            raise CostUnknown() if stopped == CostUnknown.reason else BudgetReached()

    async def stopped(self) -> bool:
        return bool(await self._run(self.store.stopped))

    async def admit(self, tokens: float) -> None:
        """Wait for the request's turn under the run's rate limits and the pause after 429s."""
        wait = await self._run(self.store.admit, self.requests, self.tokens, tokens if self.tokens else 0.0)
        if wait > 0:
            await asyncio.sleep(wait)

    def rate_limited(self, retry_after: float | None) -> None:
        """The endpoint answered 429: pause every session of the run (recorded in order, not awaited)."""
        self._thread.submit(self.store.strike, retry_after)

    async def pay(self, key: str, data: dict, cost: float | None, charged: float) -> bool:
        """A reply as soon as it came, before anything of it is read: when the endpoint charges for it
        (reply_cost.billed), its cost into the ledger (the token bucket set right for the `charged`
        tokens taken before it) and the reply into the cache, in one transaction, so no kill -9 between
        the two pays for it again on --resume; whether it was charged. A reply then found bad is
        forgotten (forget); one not charged goes into the cache once it is read (keep)."""
        if not billed(data):
            return False
        used = tokens(reply_usage(data))["total_tokens"]
        await self._run(self.store.settle, key, self._stored(data), cost, used, None, charged if self.tokens else 0.0)
        return True

    async def keep(self, key: str, data: dict, cost: float | None) -> None:
        """A reply nobody charged for, read and found good: into the cache before it is used."""
        if self.settings.cache:
            await self._run(self.store.keep, key, self._stored(data), cost)

    async def forget(self, key: str) -> None:
        """A cached reply found bad: out of the cache, so the request is sent again."""
        await self._run(self.store.forget, key)

    def _stored(self, data: dict) -> bytes | None:
        """A reply as the cache keeps it (None with --no_cache): its secrets masked, what orjson cannot
        encode kept as text."""
        return self.redact(dumps(data).decode()).encode() if self.settings.cache else None

    async def release(self, reservation: int | None) -> None:
        if reservation is not None:
            await self._run(self.store.release, reservation)

    async def price_later(self, key: str, cost: float) -> None:
        await self._run(self.store.price_later, key, cost)

    async def stop_unknown_cost(self) -> None:
        await self._run(self.store.stop, CostUnknown.reason)

    async def close(self) -> None:
        await self._run(self.store.close)
        self._thread.shutdown(wait=False)
