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
import contextlib
import threading
from pathlib import Path

from trajforge.money.errors import SpendStop, stop_for
from trajforge.money.store import Store

HELD = {"reserve": "release", "take_slot": "free_slot"}  # a call that hands out an id -> the call that ends it
GIVEN_BACK = {"free_slot": ("cancelled",)}  # what an ending call says of an id given back: a place's teaches nothing


class LocalLedger:
    """The store's calls in order on one thread of their own (one connection, used in order), off the
    event loop, each answered as soon as it returns. The calls asked while it works wait in one list it
    takes at once: at hundreds of sessions a worker, a thread pool's hand-over for each of the six calls
    around a model call (a work item, two futures chained, a semaphore, a wake-up of an idle thread) cost
    more CPU than the calls themselves. A call whose caller was cancelled meanwhile (a sample's timeout, a
    stop) still runs: a paid reply's cost and cache entry (settle), a place or reservation given back, are
    never lost because nobody waits for the answer any more; only a call that would hand out a place or a
    reservation to nobody (HELD) does not run, and one already handed out is given back: by the caller's
    loop, or by this thread when that loop is gone or the ledger closes first (what was handed out and not
    ended is ended before the store closes)."""

    def __init__(self, folder: str):
        self.store = Store(Path(folder))
        self._asked: list[tuple[asyncio.AbstractEventLoop, asyncio.Future, str, tuple]] = []
        self._turn = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._giving: set[asyncio.Future] = set()  # what a cancelled caller was handed, being given back
        self._out: set[tuple[str, object]] = set()  # (the call that ends it, an id) handed out, not ended (thread)

    async def __call__(self, name: str, *args):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._turn:
            if self._closed:
                raise RuntimeError("the money ledger is closed")
            self._closed = name == "close"
            self._asked.append((loop, future, name, args))
            if self._thread is None:  # made on first use: in the process that uses it, never across a fork
                self._thread = threading.Thread(target=self._serve, name="money", daemon=True)
                self._thread.start()
            self._turn.notify()
        return await future

    def _serve(self) -> None:
        while True:
            with self._turn:
                while not self._asked:
                    self._turn.wait()
                batch, self._asked = self._asked, []
            for loop, future, name, args in batch:
                if future.cancelled() and name in HELD:  # a place or reservation nobody would take
                    continue
                if name == "close":  # the last call there is: nothing stays held past it
                    for held in list(self._out):
                        self._end(*held)
                try:
                    value, error = getattr(self.store, name)(*args), None
                except BaseException as exc:  # raised again in the caller, as a thread pool's future would
                    value, error = None, exc
                if name in HELD and value is not None:
                    self._out.add((HELD[name], value))
                elif name in HELD.values():
                    self._out.discard((name, args[0]))
                try:  # each answered at once
                    loop.call_soon_threadsafe(self._answer, future, name, value, error)
                except RuntimeError:  # its loop is closed: nobody waits, and nobody would give back what it holds
                    if name in HELD and value is not None:
                        self._end(HELD[name], value)
            if any(name == "close" for _, _, name, _ in batch):
                return

    def _end(self, name: str, held: object) -> None:
        """What was handed out to a caller gone, ended here (a place freed as one whose outcome teaches nothing)."""
        self._out.discard((name, held))
        with contextlib.suppress(Exception):  # a store that fails now: the place or reservation expires with us
            getattr(self.store, name)(held, *GIVEN_BACK.get(name, ()))

    async def close(self) -> None:
        await self("close")

    def _answer(self, future: asyncio.Future, name: str, value, error: BaseException | None) -> None:
        if future.cancelled():  # its caller is gone: what it was handed is given back
            if name in HELD and value is not None:  # a place: freed as one whose outcome teaches nothing
                ending = (HELD[name], value, *GIVEN_BACK.get(HELD[name], ()))
                giving = asyncio.ensure_future(self._give_back(*ending))  # closed meanwhile: close ended it
                self._giving.add(giving)
                giving.add_done_callback(self._giving.discard)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    async def _give_back(self, name: str, *args) -> None:
        with contextlib.suppress(RuntimeError):  # closed meanwhile: the thread ended it before the store closed
            await self(name, *args)


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
