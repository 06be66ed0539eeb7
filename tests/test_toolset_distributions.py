"""The per-prompt toolset draw in-process (toolset_distributions)."""

from __future__ import annotations

from toolset_distributions import DISTRIBUTIONS, sample_rng, sample_toolsets, usable


class Always:
    """A random source whose every draw is `value` (0 switches every toolset on, 0.999 every one off)."""

    def __init__(self, value: float):
        self.value = value

    def random(self) -> float:
        return self.value


def test_each_toolset_is_a_coin_flip_with_its_probability():
    weights = {"web": 100, "vision": 50, "browser": 1}
    assert sample_toolsets(weights, Always(0.0)) == ["browser", "vision", "web"]
    assert sample_toolsets(weights, Always(0.499)) == ["vision", "web"]
    assert sample_toolsets(weights, Always(0.5)) == ["web"]


def test_when_every_flip_fails_the_most_likely_toolset_is_used():
    assert sample_toolsets({"web": 30, "terminal": 80, "file": 80}, Always(0.999)) == ["terminal"]
    assert sample_toolsets({}, Always(0.0)) == []


def test_the_draw_depends_only_on_the_seed_the_entry_and_the_sample():
    weights = DISTRIBUTIONS["balanced"]
    keys = [f"entry {i}" for i in range(10)]

    def draws(seed, order) -> dict[tuple[str, int], list[str]]:
        return {(key, sample): sample_toolsets(weights, sample_rng(seed, key, sample)) for key, sample in order}

    forward = draws(7, [(key, sample) for key in keys for sample in range(4)])
    assert draws(7, reversed(list(forward))) == forward  # scheduling order does not matter
    assert len({tuple(v) for v in forward.values()}) > 5  # samples do get different draws
    assert len({tuple(forward[keys[0], sample]) for sample in range(4)}) > 1  # also the samples of one entry
    assert draws(8, forward) != forward


def test_usable_keeps_only_what_this_run_can_offer():
    assert usable("terminal_tasks", {"terminal", "file", "code_execution"}) == {"terminal": 97, "file": 97}
    assert usable("browser_only", {"terminal"}) == {}


def test_a_seeded_draw_is_stable_across_versions():
    """Runs with the same --seed are meant to be comparable later, so the draw for a seed is pinned
    (since samples: per entry key and sample index, no longer per position in the dataset)."""
    key = '["p", null, null, null]'
    assert [sample_toolsets(DISTRIBUTIONS["development"], sample_rng(7, key, i)) for i in range(4)] == [
        ["web"],
        ["terminal"],
        ["file", "terminal"],
        ["file", "terminal", "vision"],
    ]
