"""The run folder's money database (SQLite, WAL): the response cache, the ledger of paid calls, the
budget's reservations of calls in flight, the rate-limit buckets, the shared 429 pause and each
endpoint's adaptive concurrency limit with its requests in flight.

One file, opened by every worker process (and Ray task on this machine) at once: writes go in short
IMMEDIATE transactions, waiting for each other within the busy timeout; readers never wait. A
committed reply survives kill -9 (WAL with synchronous=NORMAL loses at most the last transactions of a
power cut, never the database). A connection is opened per process on first use, never carried across
a fork. Synchronous: callers run these methods off their event loop (spending.py).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trajforge.money import pricing
from trajforge.money.bucket import Bucket, backoff
from trajforge.money.concurrency import Concurrency, Limit
from trajforge.money.errors import BudgetReached, stop_for

FILE_NAME = "responses.sqlite"
BUSY_TIMEOUT_MS = 60_000
EPSILON = 1e-9  # dollars: sums of floats must not stop a call that fits exactly

SCHEMA = """
CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, data BLOB NOT NULL, cost REAL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS paid (id INTEGER PRIMARY KEY, key TEXT NOT NULL, cost REAL, tokens INTEGER NOT NULL,
                                 at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY CHECK (id = 0), spent REAL NOT NULL, paid_calls INTEGER
    NOT NULL, unknown_calls INTEGER NOT NULL, hits INTEGER NOT NULL, saved REAL NOT NULL, largest REAL);
INSERT OR IGNORE INTO totals VALUES (0, 0, 0, 0, 0, 0, NULL);
CREATE TABLE IF NOT EXISTS reservations (id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, amount REAL NOT NULL,
                                         at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS buckets (name TEXT PRIMARY KEY, level REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS state (name TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS limits (endpoint TEXT PRIMARY KEY, adaptive INTEGER NOT NULL, start INTEGER NOT NULL,
    value INTEGER NOT NULL, ceiling INTEGER NOT NULL, successes INTEGER NOT NULL, epoch INTEGER NOT NULL,
    low INTEGER NOT NULL, high INTEGER NOT NULL, area REAL NOT NULL, began REAL NOT NULL, changed REAL NOT NULL,
    rate_limited INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS flights (id INTEGER PRIMARY KEY, endpoint TEXT NOT NULL, pid INTEGER NOT NULL,
                                    epoch INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class SpendingTotals:
    spent: float  # USD of every paid call whose cost is known, in every invocation on this folder
    paid_calls: int  # calls sent to the endpoint and answered (cache misses)
    unknown_calls: int  # paid calls whose cost nobody knows
    hits: int  # calls answered from the cache
    saved: float  # USD those hits would have cost again
    largest: float | None  # the most one call has cost so far
    stopped: str | None  # why this invocation makes no more calls ("budget", "cost_unknown"), if it does not


@dataclass(frozen=True)
class Call:
    """What the budget knows of a call before it starts."""

    prompt_tokens: int  # estimated from the request's size
    max_tokens: int | None
    prices: pricing.Prices | None


class Store:
    def __init__(self, folder: Path):
        self.path = Path(folder) / FILE_NAME
        self._db: sqlite3.Connection | None = None
        self._pid = 0

    def _conn(self) -> sqlite3.Connection:
        if self._db is None or self._pid != os.getpid():  # a forked child opens its own
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(SCHEMA)
            self._db, self._pid = db, os.getpid()
        return self._db

    def close(self) -> None:
        if self._db is not None and self._pid == os.getpid():
            self._db.close()
        self._db = None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _state(self, db: sqlite3.Connection, name: str, default=None):
        row = db.execute("SELECT value FROM state WHERE name = ?", (name,)).fetchone()
        return default if row is None else row[0]

    @staticmethod
    def _set(db: sqlite3.Connection, name: str, value) -> None:
        db.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (name, value))

    # -- an invocation -------------------------------------------------------------------------
    def begin(self) -> None:
        """A new invocation on the folder (no worker runs yet): what the last one left in flight,
        stopped, paused or owed is forgotten; the paid calls and the cache stay."""
        with self._write() as db:
            db.execute("DELETE FROM reservations")
            db.execute("DELETE FROM buckets")
            db.execute("DELETE FROM state")
            db.execute("DELETE FROM limits")
            db.execute("DELETE FROM flights")

    def totals(self) -> SpendingTotals:
        db = self._conn()
        row = db.execute("SELECT spent, paid_calls, unknown_calls, hits, saved, largest FROM totals").fetchone()
        spent, paid_calls, unknown_calls, hits, saved, largest = row
        return SpendingTotals(spent, paid_calls, unknown_calls, hits, saved, largest, self._state(db, "stopped"))

    def stop(self, reason: str) -> None:
        with self._write() as db:
            if self._state(db, "stopped") is None:
                self._set(db, "stopped", reason)

    def stopped(self) -> str | None:
        return self._state(self._conn(), "stopped")

    # -- the cache -----------------------------------------------------------------------------
    def cached(self, key: str) -> tuple[bytes, float | None] | None:
        """(stored reply, what it cost) of `key`, counted as a hit; None when not stored."""
        db = self._conn()
        row = db.execute("SELECT data, cost FROM replies WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        with self._write() as db:
            db.execute("UPDATE totals SET hits = hits + 1, saved = saved + ?", (row[1] or 0.0,))
        return bytes(row[0]), row[1]

    def price_later(self, key: str, cost: float) -> None:
        """The cost of a reply paid while nobody knew it (prices given since): into the cache, the
        ledger and the totals, once."""
        with self._write() as db:
            db.execute("UPDATE replies SET cost = ? WHERE key = ? AND cost IS NULL", (cost, key))
            blind = db.execute("UPDATE paid SET cost = ? WHERE key = ? AND cost IS NULL", (cost, key)).rowcount
            db.execute(
                "UPDATE totals SET spent = spent + ?, unknown_calls = unknown_calls - ?, saved = saved + ?,"
                " largest = max(coalesce(largest, 0), ?)",
                (cost * blind, blind, cost, cost),
            )

    def settle(
        self,
        key: str,
        data: bytes | None,
        cost: float | None,
        tokens: int,
        charged: float,
        endpoint: str,
    ) -> None:
        """One paid call, in one transaction: its reply into the cache (unless `data` is None:
        --no_cache), its cost into the ledger, the token bucket set right (`charged` tokens were taken
        before the call, `tokens` were used) and `endpoint`'s 429 streak ended."""
        with self._write() as db:
            if data is not None:
                _cache(db, key, data, cost)
            db.execute("INSERT INTO paid (key, cost, tokens, at) VALUES (?, ?, ?, ?)", (key, cost, tokens, time.time()))
            db.execute(
                "UPDATE totals SET spent = spent + ?, paid_calls = paid_calls + 1, unknown_calls = unknown_calls + ?,"
                " largest = max(coalesce(largest, 0), ?)",
                (cost or 0.0, cost is None, cost or 0.0),
            )
            if charged:
                db.execute("UPDATE buckets SET level = level + ? WHERE name = 'tokens'", (charged - tokens,))
            db.execute("DELETE FROM state WHERE name = ?", (f"strikes:{endpoint}",))

    def forget(self, key: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM replies WHERE key = ?", (key,))

    def keep(self, key: str, data: bytes, cost: float | None) -> None:
        """A reply into the cache whose call the ledger does not count (nobody charged for it)."""
        with self._write() as db:
            _cache(db, key, data, cost)

    # -- the budget ----------------------------------------------------------------------------
    def reserve(self, call: Call, max_cost: float, ttl: float) -> int | None:
        """A reservation for one call, or None when it must wait for calls in flight to settle. Its
        estimate is the largest call so far or its prompt and max_tokens at the prices (pricing.py);
        with neither, one call at a time finds out. Raises BudgetReached when the call cannot fit even
        once the calls in flight have settled (they only add to what is spent), which stops every
        worker's next call; CostUnknown when that stop was found."""
        with self._write() as db:
            stopped = self._state(db, "stopped")
            if not stopped:
                self._expire(db, ttl)
                spent, largest = db.execute("SELECT spent, largest FROM totals").fetchone()
                estimate = pricing.estimate(call.prompt_tokens, call.max_tokens, call.prices, largest)
                count, reserved = db.execute("SELECT count(*), total(amount) FROM reservations").fetchone()
                if estimate is None:  # unknown: one call at a time finds out what a call costs
                    room, go = spent < max_cost - EPSILON, not count
                else:  # it fits once the calls in flight have settled / it fits now
                    room = spent + estimate <= max_cost + EPSILON
                    go = spent + reserved + estimate <= max_cost + EPSILON
                if room and go:
                    return db.execute(
                        "INSERT INTO reservations (pid, amount, at) VALUES (?, ?, ?)",
                        (os.getpid(), estimate or 0.0, time.time()),
                    ).lastrowid
                if room:  # the calls in flight may cost less than they hold: wait for them to settle
                    return None
                stopped = BudgetReached.reason
                self._set(db, "stopped", stopped)  # committed before it is raised: every worker stops
        raise stop_for(stopped)

    def release(self, reservation: int) -> None:
        with self._write() as db:
            db.execute("DELETE FROM reservations WHERE id = ?", (reservation,))

    @staticmethod
    def _expire(db: sqlite3.Connection, ttl: float) -> None:
        """Reservations of a process that died (OOM, kill -9) or of a call older than any call can be."""
        db.execute("DELETE FROM reservations WHERE at < ?", (time.time() - ttl,))
        for (pid,) in db.execute("SELECT DISTINCT pid FROM reservations").fetchall():
            if not _alive(pid):
                db.execute("DELETE FROM reservations WHERE pid = ?", (pid,))

    # -- rate limits ---------------------------------------------------------------------------
    def admit(self, endpoint: str, requests: Bucket | None, tokens: Bucket | None, charge: float) -> float:
        """Take one request (and `charge` tokens) from the run's buckets; seconds to wait before
        sending it to `endpoint`: the buckets' debt, or its pause after 429s, whichever is longer."""
        now, pause = time.time(), f"pause_until:{endpoint}"
        if requests is None and tokens is None:  # no limit of ours: only the pause, read without a lock
            return max(0.0, (self._state(self._conn(), pause) or 0.0) - now)
        with self._write() as db:
            wait = max(0.0, (self._state(db, pause) or 0.0) - now)
            for name, bucket, amount in (("requests", requests, 1.0), ("tokens", tokens, charge)):
                if bucket is None:
                    continue
                row = db.execute("SELECT level, updated FROM buckets WHERE name = ?", (name,)).fetchone()
                level, updated = row if row else (bucket.capacity, now)
                level, debt = bucket.take(level, updated, now, amount)
                db.execute("INSERT OR REPLACE INTO buckets VALUES (?, ?, ?)", (name, level, now))
                wait = max(wait, debt)
        return wait

    def strike(self, endpoint: str, retry_after: float | None, start: int = 1, adaptive: bool = False) -> float:
        """`endpoint` answered 429: every session of it pauses, longer with each 429 in a row; counted
        for statistics.json (`start`, `adaptive`: its limit's, if this is its first request)."""
        with self._write() as db:
            self._limit(db, endpoint, start, adaptive)
            db.execute("UPDATE limits SET rate_limited = rate_limited + 1 WHERE endpoint = ?", (endpoint,))
            strikes = (self._state(db, f"strikes:{endpoint}") or 0) + 1
            pause = backoff(strikes, retry_after)
            until = max(self._state(db, f"pause_until:{endpoint}") or 0.0, time.time() + pause)
            self._set(db, f"strikes:{endpoint}", strikes)
            self._set(db, f"pause_until:{endpoint}", until)
        return pause

    # -- adaptive concurrency ------------------------------------------------------------------
    def take_slot(self, endpoint: str, start: int, pid: int | None = None) -> int | None:
        """A place among `endpoint`'s requests in flight (its id, to free), or None while they fill
        its limit. `pid`: the process that holds it (default ours): a dead one's places are freed."""
        with self._write() as db:
            limit = self._limit(db, endpoint, start, adaptive=True)
            if _in_flight(db, endpoint) >= limit.value:
                self._expire_flights(db)
                if _in_flight(db, endpoint) >= limit.value:
                    return None
            return db.execute(
                "INSERT INTO flights (endpoint, pid, epoch) VALUES (?, ?, ?)",
                (endpoint, pid or os.getpid(), limit.epoch),
            ).lastrowid

    def free_slot(self, flight: int, outcome: str) -> None:
        """A request has its answer: `ok` raises the limit, `overloaded` (a 429, a 503) cuts it,
        anything else (another failure) leaves it."""
        with self._write() as db:
            row = db.execute("SELECT endpoint, epoch FROM flights WHERE id = ?", (flight,)).fetchone()
            if row is None:  # freed already: its process was taken for dead
                return
            db.execute("DELETE FROM flights WHERE id = ?", (flight,))
            endpoint, epoch = row
            limit = self._limit(db, endpoint, 0, adaptive=True)
            if outcome == "ok":
                self._change(db, endpoint, limit.succeeded())
            elif outcome == "overloaded":
                self._change(db, endpoint, limit.overloaded(epoch))

    def concurrency(self, endpoint: str) -> Concurrency | None:
        """`endpoint`'s limit in this invocation: now, its least, most and mean; None before any request."""
        row = (
            self._conn()
            .execute(
                "SELECT adaptive, start, value, low, high, area, began, changed, rate_limited FROM limits"
                " WHERE endpoint = ?",
                (endpoint,),
            )
            .fetchone()
        )
        if row is None:
            return None
        adaptive, start, value, low, high, area, began, changed, refused = row
        now = max(time.time(), changed)
        mean = (area + value * (now - changed)) / (now - began) if now > began else float(value)
        return Concurrency(bool(adaptive), start, value, low, high, mean, refused)

    @staticmethod
    def _limit(db: sqlite3.Connection, endpoint: str, start: int, adaptive: bool) -> Limit:
        row = db.execute(
            "SELECT start, value, ceiling, successes, epoch FROM limits WHERE endpoint = ?", (endpoint,)
        ).fetchone()
        if row is not None:
            return Limit(*row)
        limit = Limit.first(start) if adaptive else Limit(start, start, start)
        now = time.time()
        db.execute(
            "INSERT INTO limits VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, 0)",
            (endpoint, adaptive, start, limit.value, limit.ceiling, 0, 0, limit.value, limit.value, now, now),
        )
        return limit

    @staticmethod
    def _change(db: sqlite3.Connection, endpoint: str, limit: Limit) -> None:
        now = time.time()
        db.execute(
            "UPDATE limits SET area = area + value * max(0, ? - changed), changed = ?, value = ?, ceiling = ?,"
            " successes = ?, epoch = ?, low = min(low, ?), high = max(high, ?) WHERE endpoint = ?",
            (
                now,
                now,
                limit.value,
                limit.ceiling,
                limit.successes,
                limit.epoch,
                limit.value,
                limit.value,
                endpoint,
            ),
        )

    @staticmethod
    def _expire_flights(db: sqlite3.Connection) -> None:
        for (pid,) in db.execute("SELECT DISTINCT pid FROM flights").fetchall():
            if not _alive(pid):
                db.execute("DELETE FROM flights WHERE pid = ?", (pid,))

    def free_all(self, flights: list[int]) -> None:
        """Places held by a process known to be gone (a Ray task that died): freed, nothing learnt."""
        with self._write() as db:
            db.executemany("DELETE FROM flights WHERE id = ?", [(flight,) for flight in flights])


def _in_flight(db: sqlite3.Connection, endpoint: str) -> int:
    return db.execute("SELECT count(*) FROM flights WHERE endpoint = ?", (endpoint,)).fetchone()[0]


def _cache(db: sqlite3.Connection, key: str, data: bytes, cost: float | None) -> None:
    db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)", (key, data, cost, time.time()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        return True
    return True
