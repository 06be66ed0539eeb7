"""Resume matching in-process: finished work is subtracted from the dataset by content, duplicate by
duplicate, whatever the order or length of the dataset now (trajforge.runner.match)."""

from __future__ import annotations

from collections import Counter

from trajforge.dataset import Entry
from trajforge.runfolder.folder import entry_key
from trajforge.runner import match


def entries(*items) -> list[Entry]:
    return [Entry(i, item if isinstance(item, dict) else {"prompt": item}) for i, item in enumerate(items)]


def finished(*items) -> Counter:
    return Counter(entry_key(item if isinstance(item, dict) else {"prompt": item}) for item in items)


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
