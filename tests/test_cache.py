"""The response cache: a re-run of a sample is answered from it call by call, streamed replies included,
until the conversation diverges; --no_cache pays again."""

from __future__ import annotations

import pytest

FLAGS = ["--distribution=terminal_only", "--environment=local", "--seed=5"]
ENTRIES = [{"prompt": "cached one"}, {"prompt": "cached two"}]


def forget_outcomes(result) -> None:
    """What a crash before any line was written leaves: the calls paid, no prompt finished."""
    for path in [*result.run_dir.glob("batch_*.jsonl"), result.run_dir / "checkpoint.json"]:
        path.unlink()


@pytest.mark.parametrize(("first", "then"), [("--stream", "--stream"), ("--stream", "--nostream")])
def test_a_rerun_is_answered_from_the_cache_streamed_or_not(run_here, server, first, then):
    paid = run_here(ENTRIES, *FLAGS, first)
    assert paid.code == 0, paid.stdout
    asked = len(server.chat_requests())
    forget_outcomes(paid)
    again = run_here(ENTRIES, *FLAGS, then, "--resume")
    assert again.code == 0, again.stdout
    assert len(server.chat_requests()) == asked  # nothing asked again: how a reply travelled is not its key
    assert again.statistics["cache"] == {"hits": asked, "misses": asked, "saved_cost": paid.statistics["usage"]["cost"]}
    assert [r["conversations"] for r in again.trajectories] == [r["conversations"] for r in paid.trajectories]
    assert "Response cache: 6 calls answered from it" in again.stdout


def test_no_cache_pays_again(run_here, server):
    paid = run_here(ENTRIES, *FLAGS)
    asked = len(server.chat_requests())
    forget_outcomes(paid)
    again = run_here(ENTRIES, *FLAGS, "--resume", "--no_cache")
    assert again.code == 0, again.stdout
    assert len(server.chat_requests()) == 2 * asked
    assert again.statistics["cache"] == {"hits": 0, "misses": 2 * asked, "saved_cost": 0.0}


def test_the_cache_answers_until_the_conversation_diverges(run_here, server):
    """A command whose output differs on the re-run (the time) makes the next request a new one."""
    entries = [{"prompt": "what time is it [mock command=date%20+%25s%25N]"}]
    paid = run_here(entries, *FLAGS)
    forget_outcomes(paid)
    again = run_here(entries, *FLAGS, "--resume")
    assert again.code == 0, again.stdout
    assert again.statistics["cache"]["hits"] == 1  # the first call; its tool result differs, so the rest is new
    assert len(server.chat_requests()) == 3 + 2
