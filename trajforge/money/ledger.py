"""Where a worker's Spending reaches the run's money database (store.py), which lives in the run
folder on the driver's machine:

- `LocalLedger`: a worker process of that machine opens the database itself (SQLite, WAL: many
  processes at once), its calls run on one thread so its one connection is used in order.
- `ActorLedger`: a Ray task, on any node, asks the run's `MoneyActor`, a Ray actor the driver starts
  on its own node, which owns a connection and runs each call in turn. A call returns once its
  transaction is committed, so money first holds across the network: a paid reply is in the ledger
  and the cache on the driver's disk before the task reads it.

The actor remembers what each task holds (budget reservations, places in flight) by an owner name
(its batch): a task whose worker or node died holds nothing once its batch runs again or fails for
good, while its paid replies stay in the cache for that re-run.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trajforge.money.errors import SpendStop, stop_for
from trajforge.money.store import Store

HELD = {"reserve": "release", "take_slot": "free_slot"}  # a call that hands out an id -> the call that ends it


class LocalLedger:
    def __init__(self, folder: str):
        self.store = Store(Path(folder))
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="money")  # one connection, used in order

    async def __call__(self, name: str, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, getattr(self.store, name), *args)

    async def close(self) -> None:
        await self("close")
        self._thread.shutdown(wait=False)


class MoneyActor:
    """The run's money database, served to every Ray task from the driver's node (the class is made a
    Ray actor by executors/ray_pool.py; nothing here imports Ray)."""

    def __init__(self, folder: str):
        self.store = Store(Path(folder))
        self.held: dict[str, dict[str, set[int]]] = {}  # owner -> the ending call -> the ids it still holds

    def call(self, owner: str, name: str, *args) -> tuple[str, object]:
        """("ok", what the store's `name` returned) or ("stop", the reason) when it raised a budget stop,
        which the caller raises again as itself (an exception through Ray would carry Ray's traceback)."""
        try:
            value = getattr(self.store, name)(*args)
        except SpendStop as stop:
            return "stop", stop.reason
        held = self.held.setdefault(owner, {})
        if name in HELD and value is not None:
            held.setdefault(HELD[name], set()).add(value)
        elif name in HELD.values():
            held.get(name, set()).discard(args[0])
        return "ok", value

    def forget(self, owner: str) -> None:
        """`owner` is gone (its worker or node died): its reservations are released and its places in
        flight freed, teaching the concurrency limit nothing."""
        held = self.held.pop(owner, {})
        for reservation in held.get("release", ()):
            self.store.release(reservation)
        self.store.free_all(sorted(held.get("free_slot", ())))


class ActorLedger:
    def __init__(self, actor, owner: str):
        self.actor = actor  # a handle on the run's MoneyActor
        self.owner = owner

    async def __call__(self, name: str, *args):
        status, value = await self.actor.call.remote(self.owner, name, *args)
        if status == "stop":
            raise stop_for(value)
        return value

    async def close(self) -> None:
        """The actor's connection is the run's: it stays open."""
