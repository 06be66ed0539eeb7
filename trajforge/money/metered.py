"""Money as a wrapper (issue 25): the one place where a request to the endpoint meets the response
cache, the prices, the budget and the rate limits. The agent's chat calls (model/chat.py) and the
tools' calls (vision, images: model/tool_model.py) all go through `Metered`, around the model
client's retried send, which itself knows nothing of money:

    cache lookup -> admission (budget reservation, then per attempt a place within the endpoint's
    adaptive concurrency limit and the rate limits) -> send -> pay (the cost into the ledger as soon
    as the reply came, before it is read: issue 23's money first; the reply into the cache in the
    same transaction) -> read (check): a bad reply is forgotten and tried again.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from trajforge.caller import NOBODY, Caller
from trajforge.errors import BadReply
from trajforge.money.errors import CostUnknown
from trajforge.money.pricing import Prices
from trajforge.money.reply_cost import reply_cost
from trajforge.money.spending import Spends, cache_key
from trajforge.money.store import Call
from trajforge.safejson import dumps


class Endpoint(Protocol):
    @property
    def base_url(self) -> str: ...

    @property
    def cache_as(self) -> str: ...  # the endpoint as the response cache names it, when not base_url


class Client(Protocol):
    """What the money needs of a model client (model/client.py): its endpoint, and its retried call."""

    @property
    def settings(self) -> Endpoint: ...

    async def call(self, request: Callable[[], Awaitable[Any]], caller: Caller = NOBODY) -> tuple[Any, int]: ...

    @staticmethod
    def overload(exc: BaseException) -> tuple[str, float | None] | None: ...  # retry.overload


Send = Callable[[dict], Awaitable[dict]]  # one try of a request body: its reply as JSON
Check = Callable[[dict], object]  # reads a reply; BadReply when it has no answer (tried again, never cached)
Paid = tuple[dict, float | None, int]  # (reply, its cost or None when nobody knows it, retries)


def _unchecked(data: dict) -> None:
    """The images API's answer is the tool's to read."""


class Metered:
    """The money around one endpoint's sends (`spending`: the run's, or Unmetered: straight to the endpoint,
    each reply still priced, as unit tests of the loop want)."""

    def __init__(self, client: Client, spending: Spends):
        self.client = client
        self.spending = spending
        settings = client.settings
        self.base_url = settings.base_url
        self.endpoint = settings.cache_as or settings.base_url  # as the response cache names it

    async def __call__(
        self,
        path: str,
        body: dict,
        caller: Caller,
        send: Send,
        prices: Prices | None,
        check: Check = _unchecked,
    ) -> Paid:
        """(reply, its cost, retries) of the request `body` to `path` for the `caller`'s sample: from the
        response cache when it was paid for before (retries 0), else sent by `send`, retried by the
        client, within the budget and the rate limits. Money first: each reply's cost goes into the
        ledger as soon as it arrives, before `check` (BadReply: tried again) reads it; a good reply is
        cached before it is used. CostUnknown when a cost limit is set and nobody knows a reply's cost."""
        max_tokens = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else None

        @functools.cache
        def size() -> int:  # a request's tokens, roughly: to reserve, to pace, to believe usage (not on a hit)
            return len(dumps(body)) // 4

        def cost_of(data: dict) -> float | None:
            return reply_cost(data, prices, size(), max_tokens)

        key = cache_key(self.endpoint, path, body, caller.scope)
        hit = await self.spending.cached(key)
        if hit is not None and (found := await self._from_cache(key, body, hit, cost_of, check)) is not None:
            return found
        return await self._sent(key, body, Call(size(), max_tokens, prices), send, cost_of, check, caller)

    async def _from_cache(
        self, key: str, body: dict, hit: tuple[dict, float | None], cost_of, check: Check
    ) -> Paid | None:
        """A reply paid for before: not paid again. One paid while nobody knew its cost is priced now,
        if prices were given since. None for one found bad (paid, then the run was killed before it was
        forgotten): it is sent again."""
        data, cost = hit
        spending = self.spending
        try:
            check(data)
        except BadReply:
            await spending.forget(key)
            return None
        if cost is None:
            cost = cost_of(data)
            if cost is not None:
                await spending.price_later(key, cost)
            else:
                await self._cost_unknown(body)
        return data, cost, 0

    async def _sent(self, key: str, body: dict, call: Call, send: Send, cost_of, check: Check, caller: Caller) -> Paid:
        """A request not answered before: room in the budget for all its tries, then per try the rate
        limits, the send, the payment, the reading and the cache."""
        spending = self.spending
        charged = call.prompt_tokens + (call.max_tokens or 0)
        reservation = await spending.reserve(call)

        async def attempt() -> tuple[dict, float | None]:
            # The endpoint's adaptive limit; after a 429 every session of the endpoint backs off.
            async with spending.slot(self.base_url, self.client.overload):
                await spending.admit(self.base_url, charged)
                data = await send(body)
            cost = cost_of(data)
            # Money first: paid (and cached, in the same transaction) before it is read.
            charged_for = await spending.pay(key, data, cost, charged, self.base_url)
            try:
                check(data)
            except BadReply:
                if charged_for:
                    await spending.forget(key)
                    if cost is None:
                        await self._cost_unknown(body)
                raise
            if not charged_for:
                await spending.keep(key, data, cost)
            return data, cost

        try:
            (data, cost), retries = await self.client.call(attempt, caller)
        finally:
            await spending.release(reservation)
        if cost is None:
            await self._cost_unknown(body)
        return data, cost, retries

    async def _cost_unknown(self, body: dict) -> None:
        """A reply without a cost: CostUnknown (the run stops) when a cost limit needs every cost."""
        if self.spending.settings.needs_cost:
            await self.spending.stop_unknown_cost()
            raise CostUnknown(f"{body.get('model')} at {self.base_url} reported no cost")
