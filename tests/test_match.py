"""Resume matching in-process: finished samples are subtracted from the dataset by content and sample
index, duplicate by duplicate, whatever the order or length of the dataset now
(trajforge.run.samples.plan_samples)."""

from __future__ import annotations

from collections import Counter

from trajforge.run.dataset import Entry
from trajforge.run.samples import plan_samples
from trajforge.runfolder.folder import entry_key


def entries(*items) -> list[Entry]:
    return [Entry(i, item if isinstance(item, dict) else {"prompt": item}) for i, item in enumerate(items)]


def finished(*items, sample: int = 0) -> Counter:
    return Counter((entry_key(item if isinstance(item, dict) else {"prompt": item}), sample) for item in items)


def match(dataset: list[Entry], done: Counter) -> tuple[list[Entry], list[int]]:
    """One sample per entry: (entries still to run, indices done)."""
    plan = plan_samples(dataset, done, Counter())
    return [entry for entry, _ in plan.pending], plan.done


def pending_prompts(pending: list[Entry]) -> list[tuple[int, str]]:
    return [(e.index, e.data["prompt"]) for e in pending]


def test_duplicates_are_matched_one_by_one_in_dataset_order():
    pending, done = match(entries("twice", "other", "twice", "twice"), finished("twice", "twice"))
    assert done == [0, 2]
    assert pending_prompts(pending) == [(1, "other"), (3, "twice")]


def test_a_reordered_dataset_matches_the_same_work():
    pending, done = match(entries("c", "a", "b"), finished("a", "b"))
    assert done == [1, 2] and pending_prompts(pending) == [(0, "c")]


def test_an_extended_dataset_runs_only_the_new_entries():
    pending, done = match(entries("a", "b", "new", "a"), finished("a", "b"))
    assert done == [0, 1] and pending_prompts(pending) == [(2, "new"), (3, "a")]


def test_a_shortened_dataset_ignores_work_for_entries_it_no_longer_has():
    pending, done = match(entries("b"), finished("a", "b", "b", "gone"))
    assert done == [0] and pending == []


def test_where_a_prompt_runs_is_part_of_the_task_and_extra_fields_are_not():
    dataset = entries({"prompt": "p", "image": "x:1"}, {"prompt": "p", "id": 7}, {"prompt": "p", "cwd": "sub"})
    pending, done = match(dataset, finished({"prompt": "p", "id": 1}))
    assert done == [1] and [e.index for e in pending] == [0, 2]


def test_the_callers_counter_is_left_as_it_was():
    counts = finished("a", "a")
    match(entries("a", "a", "a"), counts)
    assert counts == finished("a", "a")


def test_nothing_finished_and_nothing_to_do():
    dataset = entries("a", "b")
    assert match(dataset, Counter()) == (dataset, [])
    assert match([], finished("a")) == ([], [])


def units(plan) -> list[tuple[int, int]]:
    return [(entry.index, sample) for entry, sample in plan.pending]


def test_samples_go_out_sample_major_and_raising_n_samples_runs_only_the_new_indices():
    dataset = entries("a", "b")
    assert units(plan_samples(dataset, Counter(), Counter(), 2)) == [(0, 0), (1, 0), (0, 1), (1, 1)]
    four = sum((finished("a", "b", sample=s) for s in range(4)), Counter())
    plan = plan_samples(dataset, four, Counter(), 6)
    assert units(plan) == [(0, 4), (1, 4), (0, 5), (1, 5)] and plan.done == []
    assert [e.index for e in plan.unfinished] == [0, 1]
    # Fewer samples than the folder holds: nothing to do, the extra lines stay where they are.
    assert plan_samples(dataset, four, Counter(), 2).done == [0, 1]


def test_a_duplicate_entry_has_its_own_copy_of_each_sample():
    dataset = entries("a", "a")
    plan = plan_samples(dataset, finished("a", "a", sample=0) + finished("a", sample=1), Counter(), 2)
    assert units(plan) == [(1, 1)] and plan.done == [0]


def test_an_entry_with_enough_passes_skips_its_remaining_samples():
    dataset = entries("solved", "hard", "solved")
    runs = finished("solved", "hard", sample=0) + finished("solved", "hard", sample=1)
    passed = finished("solved", sample=0) + finished("solved", sample=1) + finished("hard", sample=1)
    plan = plan_samples(dataset, runs, passed, 4, stop_after=2)
    # The first copy of "solved" has its 2 passes: samples 2 and 3 are skipped, not pending. The
    # second copy has no line yet. "hard" has one pass.
    assert plan.skipped == 2 and plan.done == [0]
    assert units(plan) == [(2, 0), (2, 1), (1, 2), (2, 2), (1, 3), (2, 3)]
    assert plan.passes == {1: 1}
    assert plan_samples(dataset, runs, passed, 4).skipped == 0  # without --stop_after_passes
