"""Samples: every dataset entry runs `--n_samples` times. What is left to run, matched by content and
sample index with multiplicity (how workers learn that an entry has its `--stop_after_passes`:
executors/passes.py).

A unit of work is one sample of one entry, `(prompt_index, sample_index)`. Samples go out sample-major
(sample 0 of every entry, then sample 1, ...), so an entry's early samples finish, and may pass, before
its later ones start: that is what lets --stop_after_passes save the later ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from trajforge.run.dataset import Entry
from trajforge.runfolder.folder import entry_key

Unit = tuple[int, int]  # (prompt_index, sample_index)


@dataclass
class Plan:
    pending: list[tuple[Entry, int]]  # (entry, sample index) still to run, sample-major
    done: list[int]  # prompt indices every sample of which has a final outcome (or was skipped)
    unfinished: list[Entry]  # entries with a sample still to run
    skipped: int = 0  # samples not run: their entry had --stop_after_passes passes
    passes: dict[int, int] = field(default_factory=dict)  # prompt index -> passed samples, for unfinished ones
    # prompt index -> which identical copy of its entry it is (1, 2 ...; the first copies are left out): two
    # copies are samples of their own, never answered from each other's cache (money/spending.py)
    copies: dict[int, int] = field(default_factory=dict)
    # (prompt index, sample index) -> why a resume does not send it again: exhausted, endpoint (hold_back)
    held: dict[Unit, str] = field(default_factory=dict)

    def hold_back(self, why: Callable[[str, int, int], str | None]) -> None:
        """Take out of `pending` the samples that are not sent again; `why(entry key, sample, copy)` says
        why not, or None. Their entries stay unfinished: they have no final outcome."""
        kept = []
        for entry, sample in self.pending:
            reason = why(entry_key(entry.data), sample, self.copies.get(entry.index, 0))
            if reason:
                self.held[(entry.index, sample)] = reason
            else:
                kept.append((entry, sample))
        self.pending = kept


def plan_samples(
    entries: list[Entry], finished: Counter, passed: Counter, n_samples: int = 1, stop_after: int | None = None
) -> Plan:
    """Subtract the finished samples (`finished`: (entry key, sample index) -> batch lines, `passed`: the
    same for lines whose verification passed) from the dataset. A key that appears twice in the dataset
    has two copies of each sample: copy j of a sample is finished when there are more than j lines for
    it, and passed when more than j of them passed (passing lines go to the first copies)."""
    copies: Counter = Counter()
    plan = Plan([], [], [])
    for entry in entries:
        key = entry_key(entry.data)
        copy = copies[key]
        copies[key] += 1
        if copy:
            plan.copies[entry.index] = copy
        todo = [sample for sample in range(n_samples) if finished[(key, sample)] <= copy]
        passes = sum(passed[(key, sample)] > copy for sample in range(n_samples))
        if stop_after is not None and passes >= stop_after:
            plan.skipped += len(todo)
            todo = []
        if todo:
            plan.unfinished.append(entry)
            plan.pending += [(entry, sample) for sample in todo]
            if passes:
                plan.passes[entry.index] = passes
        else:
            plan.done.append(entry.index)
    plan.pending.sort(key=lambda item: item[1])  # stable: dataset order within each sample index
    return plan
