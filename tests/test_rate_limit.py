"""Rate limits hold for the whole run: two worker processes with several sessions each share one
request bucket (the run folder's database), refilled continuously rather than spent in a burst; and
the adaptive concurrency limit, shared the same way, keeps below a provider's limit on requests in
flight (bench/adaptive.py measures it at scale)."""

from __future__ import annotations

from trajforge.money.bucket import Bucket

FLAGS = ["--distribution=terminal_only", "--environment=local", "--seed=3"]


def test_the_request_rate_holds_across_two_workers(run_here, server):
    per_minute = 600  # 10 a second; the bucket holds one second's worth
    bucket = Bucket.per_minute(per_minute)
    entries = [{"prompt": f"paced {i}"} for i in range(12)]  # 36 requests
    flags = [*FLAGS, "--num_workers=2", "--concurrency=4", f"--max_requests_per_minute={per_minute}"]
    result = run_here(entries, *flags, batch_size=3)
    assert result.code == 0, result.stdout
    arrivals = sorted(r["at"] for r in server.chat_requests())
    assert len(arrivals) == 36
    # Request k can go no sooner than the bucket's content plus k-capacity refills after the first:
    # with one bucket per worker the two would send twice as fast.
    # Seconds: a request's trip from its admission to the server varies on a busy machine. A bucket per
    # worker would send the 36 in about 0.8 s instead of 2.6, far outside it.
    slack = 0.5
    for k, at in enumerate(arrivals):
        assert at - arrivals[0] >= (k + 1 - bucket.capacity) / bucket.rate - slack, (k, at - arrivals[0])
    per_second = max(sum(1 for t in arrivals if start <= t < start + 1) for start in arrivals)
    # The first second's burst is what the bucket holds plus a second of refill (and both window edges).
    assert per_second <= bucket.capacity + bucket.rate + 5  # (a bucket per worker: about 36)
    print(f"\n36 requests in {arrivals[-1] - arrivals[0]:.2f}s, at most {per_second} in one second")


def test_a_429_pauses_every_session_of_the_run(run_here, server):
    """One prompt's 429 (Retry-After: 1) pauses every session of the endpoint for a second: the others,
    which otherwise send a request every few milliseconds, send none meanwhile. (The first 0.4 s are
    left out: on a loaded machine the 429 takes that long to be read and recorded, and requests already
    admitted meanwhile go.)"""
    entries = [{"prompt": "busy [mock fail=429 times=1 retry_after=1]"}]
    entries += [{"prompt": f"calm {i} [mock turns=12]"} for i in range(3)]
    result = run_here(entries, *FLAGS, "--num_workers=1", "--concurrency=4", "--max_turns=20")
    assert result.code == 0, result.stdout
    arrivals = [r["at"] for r in server.chat_requests()]
    (struck,) = [r["at"] for r in server.chat_requests() if r["status"] == 429]
    during = [at - struck for at in arrivals if struck + 0.4 < at < struck + 0.95]
    assert not during, during
    assert any(at > struck + 0.95 for at in arrivals)  # they were paused, not done


def test_adaptive_concurrency_finds_the_servers_limit_across_two_workers(run_here, server):
    """The server takes 2 requests in flight and answers 429 (Retry-After 0.2) beyond; 8 sessions in two
    processes: the limit drops to it after the slow start's first 429s and every prompt finishes."""
    server.latency, server.max_in_flight, server.busy_retry_after = 0.1, 2, 0.2
    entries = [{"prompt": f"crowded {i}"} for i in range(16)]  # 48 answered requests
    result = run_here(entries, *FLAGS, "--num_workers=2", "--concurrency=4", batch_size=4)
    assert result.code == 0 and len(result.trajectories) == 16, result.stdout
    refused = sum(r["status"] == 429 for r in server.chat_requests())
    limit = result.statistics["concurrency"]
    assert limit["adaptive"] and limit["start"] == 8 and limit["rate_limited"] == refused
    assert 1 <= limit["min"] <= 2 and limit["max"] <= 8 and limit["min"] <= limit["mean"] <= limit["max"]
    assert refused < 0.2 * len(server.chat_requests()), refused
    assert "concurrency " in result.stderr and "/8" in result.stderr  # the progress line shows the limit
