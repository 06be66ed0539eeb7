"""The pure parts of spend control, in-process: what a call costs, the budget's estimate, the rate-limit
bucket, the response cache's key, the command that continues a stopped run, and the money database's
budget and pause rules (a real SQLite file in tmp_path)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from trajforge.agent.loop import PromptLimits
from trajforge.money.bucket import Bucket, backoff
from trajforge.money.concurrency import Limit
from trajforge.money.errors import BudgetReached, CostUnknown
from trajforge.money.pricing import Prices, estimate, priced
from trajforge.money.report import next_budget, projected
from trajforge.money.spending import cache_key, sample_scope
from trajforge.money.store import Call, Store
from trajforge.run.continuation import continue_command

USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "prompt_tokens_details": {"cached_tokens": 800}}


def test_a_reported_cost_wins_over_the_prices():
    assert priced(USAGE | {"cost": 0.25}, Prices(1.0, 2.0))["cost"] == 0.25


def test_cached_prompt_tokens_are_priced_as_cached():
    usage = priced(USAGE, Prices(input=10.0, output=30.0, cached_input=1.0))
    assert usage["cached_tokens"] == 800
    assert usage["cost"] == pytest.approx((200 * 10 + 800 * 1 + 200 * 30) / 1e6)
    # Without a cached price they cost what fresh ones do: an upper bound, never less than was paid.
    assert priced(USAGE, Prices(10.0, 30.0))["cost"] == pytest.approx((1000 * 10 + 200 * 30) / 1e6)


@pytest.mark.parametrize("reported", [None, "0.1", True, [], float("nan"), float("inf"), -1.0])
def test_no_believable_cost_and_no_prices_is_unknown_never_zero(reported):
    usage = USAGE | ({} if reported is None else {"cost": reported})
    assert priced(usage, None)["cost"] is None


def test_cached_tokens_are_never_more_than_the_prompt():
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 50}}
    assert priced(usage, Prices(1.0, 1.0))["cached_tokens"] == 5


def test_images_api_tokens_count_as_prompt_and_completion():
    usage = priced({"input_tokens": 10, "output_tokens": 256, "total_tokens": 266}, None)
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (10, 256, 266)


def test_the_estimate_is_the_largest_call_or_max_tokens_at_the_output_price():
    prices = Prices(input=1.0, output=10.0)
    assert estimate(1000, None, None, None) is None  # nothing known: one call at a time finds out
    assert estimate(1000, None, prices, 0.5) == 0.5
    assert estimate(1000, 2000, prices, None) == pytest.approx((1000 + 20000) / 1e6)
    assert estimate(1000, 2000, prices, 1.0) == 1.0


def test_the_bucket_refills_continuously_and_holds_about_a_second():
    bucket = Bucket.per_minute(600)  # 10 a second
    assert (bucket.rate, bucket.capacity) == (10.0, 10.0)
    assert Bucket.per_minute(6).capacity == 1.0  # never less than one request
    level, now, waits = bucket.capacity, 100.0, []
    for _ in range(13):  # all at once: ten go now, then one every tenth of a second
        level, wait = bucket.take(level, now, now, 1)
        waits.append(round(wait, 6))
    assert waits == [0.0] * 10 + [0.1, 0.2, 0.3]
    assert bucket.level(-3.0, 100.0, 100.2) == pytest.approx(-1.0)
    assert bucket.level(0.0, 0.0, 3600.0) == bucket.capacity  # no burst after a quiet hour


def test_a_token_charge_is_set_right_by_what_was_used():
    tokens = Bucket.per_minute(60_000)  # 1000 a second
    level, wait = tokens.take(tokens.capacity, 0.0, 0.0, 3000)  # an estimate beyond a second's worth
    assert level == -2000 and wait == pytest.approx(2.0)
    assert tokens.take(level + (3000 - 500), 0.0, 0.0, 0)[1] == 0.0  # it used 500: the debt is gone


def test_repeated_429s_back_off_longer_unless_the_server_says_how_long():
    assert [backoff(n, None) for n in (1, 2, 3, 10)] == [0.5, 1.0, 2.0, 60.0]
    assert backoff(5, 0.3) == 0.3


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}


def test_the_cache_key_is_stable_and_sees_every_part_of_the_request():
    key = cache_key("http://h/v1", "/chat/completions", BODY, "s")
    reordered = {"tools": BODY["tools"], "messages": BODY["messages"], "model": "m"}
    assert cache_key("http://h/v1/", "/chat/completions", reordered, "s") == key
    different = [
        cache_key("http://other/v1", "/chat/completions", BODY, "s"),
        cache_key("http://h/v1", "/images/generations", BODY, "s"),
        cache_key("http://h/v1", "/chat/completions", BODY | {"model": "n"}, "s"),
        cache_key("http://h/v1", "/chat/completions", BODY | {"max_tokens": 5}, "s"),
        cache_key("http://h/v1", "/chat/completions", BODY | {"reasoning": {"effort": "low"}}, "s"),
        cache_key("http://h/v1", "/chat/completions", BODY | {"tools": []}, "s"),
        cache_key("http://h/v1", "/chat/completions", BODY, "another sample"),
    ]
    assert len({key, *different}) == 8


def test_the_cache_key_is_the_same_in_another_process():
    """No hash seed or other per-process state may enter it: a resumed run is another process."""
    code = "from trajforge.money.spending import cache_key; print(cache_key('http://h/v1', '/p', {'a': [1, 'x']}, 's'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == cache_key("http://h/v1", "/p", {"a": [1, "x"]}, "s")


def test_samples_and_copies_of_an_entry_have_scopes_of_their_own():
    scopes = {sample_scope("k", occurrence, sample) for occurrence in (0, 1) for sample in (0, 1)}
    assert len(scopes) == 4 and sample_scope("k", 1, 0) == sample_scope("k", 1, 0)


def test_per_prompt_limits():
    usage = {"total_tokens": 100, "cost": 0.02}
    assert PromptLimits().reached(usage) is None
    assert PromptLimits(max_tokens=100).reached(usage) == "token_limit"
    assert PromptLimits(max_cost=0.02).reached(usage) == "cost_limit"
    assert PromptLimits(max_cost=0.03, max_tokens=101).reached(usage) is None
    assert PromptLimits(max_cost=0.01).reached(usage | {"cost": None}) is None  # unknown: the client stops it


def test_the_command_to_continue_keeps_the_flags_sets_the_budget_and_leaves_secrets_out():
    """Issue 24's defect 4: `--api_key=<as before>` was a shell redirection; now the key is left out
    with a note, and the line is shell-quoted."""
    argv = ["batch_runner.py", "--dataset_file=d.jsonl", "--max_cost", "5", "--api_key=sk-SECRET", "--resume"]
    argv += ["--max-cost=7", "--run_name", "my run", "--verbose", "--noresume"]
    command, notes = continue_command(argv, {"max_cost": "12.50"})
    kept = ["--dataset_file=d.jsonl", "--run_name", "my run", "--verbose"]
    assert command == shlex.join([sys.executable, "batch_runner.py", *kept, "--resume", "--max_cost=12.50"])
    assert "SECRET" not in command and "<" not in command
    assert notes == ["pass --api_key again or set OPENROUTER_API_KEY (or OPENAI_API_KEY)"]


def test_the_next_budget_and_the_projection():
    assert next_budget(3.0, 3.0, finished=10, total=40) == 12.0
    assert next_budget(3.0, 3.0, finished=0, total=40) == 6.0
    assert next_budget(0.001, 3.0, finished=10, total=11) == 3.3  # never less than the budget so far
    assert next_budget(1.0, 1.0, finished=10, total=20, guess=1.6) == 2.0  # it covers the projected total too
    assert next_budget(1.0, 1.0, finished=10, total=12, guess=1.6) == 1.76
    assert projected(1.0, 3.0, ended=4, planned=10) == pytest.approx(6.0)
    assert projected(1.0, 1.0, ended=0, planned=10) is None


def settle(store: Store, reservation: int | None, cost: float | None) -> None:
    store.settle("k", b"{}", cost, 10, 0.0, "E")
    if reservation is not None:
        store.release(reservation)


def test_the_budget_lets_one_call_find_out_the_cost_then_stops_before_crossing(tmp_path):
    store, other = Store(tmp_path), Store(tmp_path)  # two connections, as two workers have
    call = Call(100, None, None)
    first = store.reserve(call, max_cost=0.05, ttl=60)
    assert other.reserve(call, max_cost=0.05, ttl=60) is None  # waits: nobody knows what a call costs yet
    settle(store, first, 0.02)
    second = other.reserve(call, max_cost=0.05, ttl=60)
    assert store.reserve(call, max_cost=0.05, ttl=60) is None  # 0.02 + 0.02 in flight + 0.02 > 0.05: wait
    settle(other, second, 0.02)
    with pytest.raises(BudgetReached):  # 0.04 + 0.02 > 0.05 with nothing in flight: reached
        store.reserve(call, max_cost=0.05, ttl=60)
    with pytest.raises(BudgetReached):  # and every worker's next call stops too
        other.reserve(call, max_cost=1.0, ttl=60)
    totals = other.totals()
    assert (totals.spent, totals.paid_calls, totals.stopped) == (pytest.approx(0.04), 2, "budget")
    store.begin()  # the next invocation (a larger --max_cost) may go on
    assert store.reserve(call, max_cost=1.0, ttl=60) is not None


def test_a_dead_workers_reservation_is_dropped(tmp_path):
    store = Store(tmp_path)
    settle(store, None, 0.01)  # a cost is known
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    db = store._conn()
    db.execute("INSERT INTO reservations (pid, amount, at) VALUES (?, 0.5, strftime('%s','now'))", (child.pid,))
    assert store.reserve(Call(1, None, None), max_cost=0.515, ttl=60) is None  # the live one holds the room
    child.communicate(b"")
    assert store.reserve(Call(1, None, None), max_cost=0.515, ttl=60) is not None
    assert os.getpid() in {pid for (pid,) in db.execute("SELECT pid FROM reservations")}


def test_a_cost_unknown_stop_is_raised_as_such(tmp_path):
    store = Store(tmp_path)
    store.stop(CostUnknown.reason)
    with pytest.raises(CostUnknown):
        store.reserve(Call(1, None, None), max_cost=1.0, ttl=60)


def test_a_429_pauses_every_connection_and_a_success_ends_the_streak(tmp_path):
    store, other = Store(tmp_path), Store(tmp_path)
    assert other.admit("E", None, None, 0) == 0.0
    store.strike("E", None)
    assert 0.4 < other.admit("E", None, None, 0) <= 0.5
    assert other.admit("judge", None, None, 0) == 0.0  # another endpoint goes on
    assert store.strike("E", None) == 1.0  # the second in a row: twice as long
    settle(store, None, 0.0)
    assert store.strike("E", None) == 0.5


def test_request_buckets_are_shared_between_connections(tmp_path):
    store, other = Store(tmp_path), Store(tmp_path)
    bucket = Bucket.per_minute(120)  # 2 a second, holds 2
    store.totals(), other.totals()  # connected first: opening one must not count as refill time
    waits = [connection.admit("E", bucket, None, 0) for connection in (store, other, store, other)]
    assert waits[:2] == [0.0, 0.0] and 0.4 < waits[2] <= 0.5 and 0.9 < waits[3] <= 1.0


def test_the_limit_starts_slow_halves_once_per_burst_and_grows_back_by_windows():
    limit = Limit.first(50)
    assert limit.value == 4
    for _ in range(4):  # slow start: one more per success
        limit = limit.succeeded()
    assert limit.value == 8
    sent_in = limit.epoch
    limit = limit.overloaded(sent_in)
    assert (limit.value, limit.ceiling) == (4, 4)
    assert limit.overloaded(sent_in) == limit  # the rest of the burst was sent under the old limit
    for _ in range(7):
        limit = limit.succeeded()
    assert limit.value == 4  # a window is twice the limit
    assert limit.succeeded().value == 5
    one = Limit.first(1)
    assert one.overloaded(0).value == 1 and one.succeeded() == one  # never below 1, never above the start


def test_places_in_flight_are_shared_between_connections_and_cut_by_a_429(tmp_path):
    store, other = Store(tmp_path), Store(tmp_path)
    flights = [connection.take_slot("E", 50) for connection in (store, other, store, other)]
    assert None not in flights and other.take_slot("E", 50) is None  # the slow start's 4 are taken
    assert store.take_slot("judge", 50) is not None  # another endpoint has its own
    for connection, flight in ((store, flights[0]), (other, flights[1])):
        connection.strike("E", None, 50, True)  # a 429: counted, and the endpoint paused
        connection.free_slot(flight, "overloaded")  # the second was sent before the cut: no second cut
    seen = store.concurrency("E")
    assert (seen.now, seen.low, seen.high, seen.rate_limited) == (2, 2, 4, 2)
    assert store.take_slot("E", 50) is None  # 2 still in flight fill the limit of 2
    store.free_slot(flights[2], "failed")  # a failure that says nothing of the load
    assert other.concurrency("E").now == 2 and other.take_slot("E", 50) is not None
    store.strike("off", 1.0, 8, False)
    assert store.concurrency("off").as_dict() == {
        "adaptive": False,
        "start": 8,
        "min": 8,
        "max": 8,
        "mean": 8.0,
        "rate_limited": 1,
    }


def test_a_dead_process_s_places_are_freed(tmp_path):
    store = Store(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    held = [store.take_slot("E", 2, pid=child.pid) for _ in range(2)]
    assert None not in held and store.take_slot("E", 2) is None
    child.communicate(b"")
    assert store.take_slot("E", 2) is not None


def test_the_local_ledger_answers_in_order_raises_as_the_store_and_keeps_what_a_cancelled_call_paid(tmp_path):
    """LocalLedger's own thread: calls run in the order asked, each answered as soon as it returns (not
    after the calls queued behind it), a budget stop raised in the caller. A call whose caller is cancelled
    while it waits (here behind another process's write lock) still runs when it records money: a paid
    reply's cost and cache entry were lost when its sample was cancelled meanwhile (review 5, HIGH: over
    budget, and paid again on --resume); one that would hand out a place in flight does not, and a place
    handed out to a caller cancelled meanwhile is freed."""
    import asyncio
    import sqlite3

    from trajforge.money.ledger import LocalLedger
    from trajforge.money.store import FILE_NAME

    async def main():
        ledger = LocalLedger(str(tmp_path))
        assert await ledger("stopped") is None
        assert await ledger("take_slot", "http://a", 1) == 1
        assert await ledger("take_slot", "http://a", 1) is None  # its limit: one in flight
        other = sqlite3.connect(tmp_path / FILE_NAME, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another worker holds the write lock
        read = asyncio.ensure_future(ledger("stopped"))
        blocked = asyncio.ensure_future(ledger("stop", CostUnknown.reason))  # waits for the lock
        paid = asyncio.ensure_future(ledger("settle", "k1", b"{}", 0.5, 10, 0.0, "http://a"))
        place = asyncio.ensure_future(ledger("take_slot", "http://b", 1))
        assert await asyncio.wait_for(read, 5) is None  # answered while the write behind it waits
        await asyncio.sleep(0.2)
        paid.cancel()
        place.cancel()
        other.execute("COMMIT")
        await blocked
        assert await ledger("stopped") == CostUnknown.reason
        assert await ledger("cached", "k1") == (b"{}", 0.5)  # the cancelled sample's paid reply: kept
        assert await ledger("take_slot", "http://b", 1) is not None  # the cancelled caller held no place
        with pytest.raises(CostUnknown):
            await ledger("reserve", Call(10, 10, None), 1.0, 3600.0)
        await ledger.close()
        with pytest.raises(RuntimeError):
            await ledger("stopped")
        return paid, place

    assert all(call.cancelled() for call in asyncio.run(main()))
    assert Store(tmp_path).stopped() == CostUnknown.reason


def test_a_place_handed_to_a_caller_cancelled_as_the_ledger_closes_is_freed(tmp_path):
    """(review 6) A place handed out to a caller cancelled meanwhile was given back by a new call from the
    caller's loop, refused once the ledger had closed (the worker's end): the place stayed held by a live
    process, one less for every other worker of the endpoint until this one exited. The ledger's thread
    ends what it handed out and was not ended before the store closes. The twin's caller is not cancelled:
    it gets its place, which the worker's end frees as well (no call could free it after the close)."""
    import asyncio
    import sqlite3

    from trajforge.money.ledger import LocalLedger
    from trajforge.money.store import FILE_NAME

    async def run(cancelled: bool) -> None:
        (tmp_path / str(cancelled)).mkdir()
        ledger = LocalLedger(str(tmp_path / str(cancelled)))
        assert await ledger("stopped") is None
        other = sqlite3.connect(tmp_path / str(cancelled) / FILE_NAME, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another worker holds the write lock: the place is handed out later
        place = asyncio.ensure_future(ledger("take_slot", "http://b", 1))
        await asyncio.sleep(0.2)  # the ledger's thread waits in it
        closing = asyncio.ensure_future(ledger.close())
        await asyncio.sleep(0)  # asked before the place's answer reaches this loop
        if cancelled:
            place.cancel()
        other.execute("COMMIT")
        await closing
        if not cancelled:
            assert isinstance(await place, int)  # its place, answered as the ledger closes

    for cancelled in (True, False):
        asyncio.run(run(cancelled))
        assert Store(tmp_path / str(cancelled)).take_slot("http://b", 1) is not None, cancelled  # free again
