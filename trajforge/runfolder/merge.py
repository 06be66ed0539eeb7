"""Merge every batch file into trajectories.jsonl (and preferences.jsonl), applying the filters and
--keep, and total up statistics.

A pure filter over batch files: a later run can merge again with other settings without calling the
model. It streams line by line, so memory stays flat however large the run folder is; --keep=best and
preference pairs read the files a second time, for the lines the first pass chose.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from trajectory import EMPTY_THINK, known_cost, upgrade, verification_passed
from trajforge.runfolder.folder import RunFolder, sample_key, write_atomic
from trajforge.runfolder.preferences import Candidate, best, pair, preference_line
from trajforge.runfolder.token_lines import TokenTotals, token_line, write_with_tokens
from trajforge.safejson import dumps
from trajforge.secrets import KINDS


@dataclass
class TrajectoryTotals:
    completed: int = 0
    partial: int = 0
    discarded_no_reasoning: int = 0
    discarded_hallucinated_tools: int = 0
    trajectories: int = 0
    tool_statistics: dict = field(default_factory=dict)
    reasoning_statistics: dict = field(default_factory=dict)
    usage: dict = field(default_factory=dict)
    cost_known: bool = True  # every trajectory's cost is known (a null cost makes the total null)
    finished: Counter = field(default_factory=Counter)  # (entry key, sample index) with a final outcome
    passed: Counter = field(default_factory=Counter)  # the same, for samples whose verification passed
    redactions: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))  # secrets masked, by kind
    verification: dict = field(default_factory=dict)
    tokens: TokenTotals = field(default_factory=TokenTotals)


def dropped(reason: str | None, require_reasoning: bool) -> bool:
    """Whether a sample discarded for `reason` stays out of trajectories.jsonl: the progress line counts
    discards by the same rule as the merge."""
    return reason == "hallucinated_tool" or (reason == "no_reasoning" and require_reasoning)


def _rates(stats: dict, exits: Counter) -> dict:
    out = {}
    for name, entry in stats.items():
        count = entry["count"]
        out[name] = {
            **entry,
            "success_rate": round(entry["success"] / count, 4) if count else 0.0,
            "failure_rate": round(entry["failure"] / count, 4) if count else 0.0,
            "nonzero_exits": exits[name],  # successful calls whose command exited non-zero (terminal, execute_code)
        }
    return out


class Verified:
    """Verification counts over every sample with a line, per entry key too (pass@1, pass@k)."""

    def __init__(self):
        self.samples = self.passed = self.errors = 0
        self.reward = 0.0
        self.by_key: dict[str, list[int]] = {}  # key -> [verified, passed]

    def add(self, key: str, verification: dict, passed: bool) -> None:
        self.samples += 1
        self.passed += passed
        self.errors += bool(verification.get("error"))  # "" (null in older records) when there was none
        self.reward += verification.get("reward") or 0.0
        counts = self.by_key.setdefault(key, [0, 0])
        counts[0] += 1
        counts[1] += passed

    def summary(self, pairs: int) -> dict:
        entries = list(self.by_key.values())
        share = (lambda values: round(sum(values) / len(values), 4)) if entries else (lambda values: None)
        return {
            "verified_samples": self.samples,
            "passed": self.passed,
            "failed": self.samples - self.passed,
            "errors": self.errors,
            "mean_reward": round(self.reward / self.samples, 4) if self.samples else None,
            "pass_at_1": share([passed / verified for verified, passed in entries]),
            "pass_at_k": share([passed > 0 for _, passed in entries]),
            "entries_all_passed": sum(passed == verified for verified, passed in entries),
            "entries_none_passed": sum(passed == 0 for _, passed in entries),
            "preference_pairs": pairs,
            "skipped_after_pass": 0,  # the runner knows it: it needs the dataset
        }


def _sum_usage(usage: dict, record_usage: dict, totals: TrajectoryTotals) -> None:
    """Add a record's usage to statistics.json's: its cost is None as soon as one record's is unknown
    (never a sum that leaves a prompt out); `cost_known` is statistics.json's own key."""
    for key, value in record_usage.items():
        if key == "cost_known":
            continue
        if key == "cost" and (known_cost(record_usage) is None or usage.get(key, 0) is None):
            totals.cost_known = False
            usage[key] = None
        else:
            usage[key] = usage.get(key, 0) + value


def _clean(line: bytes, record: dict) -> bytes:
    """The line as trajectories.jsonl has it: without the batch file's own keys, in this version's shape."""
    own = [record.pop(key, None) for key in ("discarded", "redactions", "nonzero_exits", "tokens")]
    return line if own == [None] * len(own) and not upgrade(record) else dumps(record) + b"\n"


def merge(
    folder: RunFolder,
    require_reasoning: bool,
    tool_names: list[str],
    warn: Callable[[str], None],
    keep: str = "all",
    observe: Callable[[dict, str | None], None] | None = None,
    tokens: bool = False,
) -> TrajectoryTotals:
    """`observe(record, why it was dropped or None)` sees every finished sample (the report's data);
    with `tokens`, tokens.jsonl gets a line for each line of trajectories.jsonl."""
    run = Merge(folder, require_reasoning, tool_names, warn, keep, observe)
    if keep == "best":
        run.first_pass(None)
    else:
        write_with_tokens(folder, tokens, run.first_pass)
    chosen = {c.position for c in map(best, run.candidates.values()) if c} if keep == "best" else set()
    pairs = [found for found in map(pair, run.candidates.values()) if found]
    if keep == "best" or pairs:
        _second_pass(folder, warn, chosen, pairs, run.written, keep == "best", tokens)
    if not pairs:  # no pair now: none from an earlier merge, and no empty file `datasets` cannot load
        folder.preferences.unlink(missing_ok=True)
    return run.result(len(pairs))


class Merge:
    """One merge's counts over every line of the batch files (the first pass reads each once), and the
    totals they add up to."""

    def __init__(self, folder: RunFolder, require_reasoning: bool, tool_names: list[str], warn, keep: str, observe):
        self.folder = folder
        self.require_reasoning = require_reasoning
        self.warn = warn
        self.keep = keep  # all, passed or best (best: written by the second pass)
        self.observe = observe
        self.totals = TrajectoryTotals()
        self.tools = {name: {"count": 0, "success": 0, "failure": 0} for name in tool_names}
        self.turns = self.with_reasoning = 0
        self.usage: dict = {}
        self.exits: Counter = Counter()
        self.verified = Verified()
        self.candidates: dict[str, list[Candidate]] = {}  # verified samples the filters keep, by entry key

    def written(self, record: dict) -> None:
        self.totals.trajectories += 1
        self.totals.completed += record["completed"]
        self.totals.partial += record["partial"]

    def first_pass(self, handle, ids=None) -> None:
        """Count every line; write those `keep` keeps to `handle` (and their token lines to `ids`)."""
        for position, (line, record) in enumerate(self.folder.batch_lines(self.warn)):
            key, sample = sample_key(record)
            verification = record["metadata"].get("verification") or {}
            passed = verification_passed(verification)
            reason = self.count(record, key, sample, verification, passed)
            if self.observe is not None:
                self.observe(record, reason)
            if reason is not None:
                continue
            if passed is not None:
                reward = verification.get("reward") or 0.0
                self.candidates.setdefault(key, []).append(
                    Candidate(position, passed, reward, record.get("api_calls", 0), sample)
                )
            if handle is not None and (self.keep == "all" or (self.keep == "passed" and passed)):
                if ids is not None:
                    ids.write(token_line(record))
                handle.write(_clean(line, record))
                self.written(record)

    def count(self, record: dict, key: str, sample: int, verification: dict, passed: bool | None) -> str | None:
        """Add a finished sample to the counts; why it stays out of trajectories.jsonl (None: it may go in)."""
        totals = self.totals
        for turn in record["conversations"]:
            if turn["from"] == "gpt":
                self.turns += 1
                self.with_reasoning += not turn["value"].startswith(EMPTY_THINK)
        for name, entry in record["tool_stats"].items():
            known = self.tools.setdefault(name, {"count": 0, "success": 0, "failure": 0})
            for stat in known:
                known[stat] += entry[stat]
        _sum_usage(self.usage, record["metadata"]["usage"], totals)
        totals.finished[key, sample] += 1
        if passed is not None:
            self.verified.add(key, verification, passed)
            totals.passed[key, sample] += passed
        totals.tokens.add(record)
        self.exits.update(record.get("nonzero_exits") or {})
        for kind, count in (record.get("redactions") or {}).items():
            totals.redactions[kind] = totals.redactions.get(kind, 0) + count
        reason = record.get("discarded")
        if not dropped(reason, self.require_reasoning):  # the one rule, the progress line's too
            return None
        if reason == "hallucinated_tool":
            totals.discarded_hallucinated_tools += 1
        else:
            totals.discarded_no_reasoning += 1
        return reason

    def result(self, pairs: int) -> TrajectoryTotals:
        totals, turns, with_reasoning = self.totals, self.turns, self.with_reasoning
        totals.verification = self.verified.summary(pairs)
        totals.tool_statistics = _rates(self.tools, self.exits)
        totals.reasoning_statistics = {
            "total_assistant_turns": turns,
            "turns_with_reasoning": with_reasoning,
            "turns_without_reasoning": turns - with_reasoning,
            "coverage": round(with_reasoning / turns, 4) if turns else 0.0,
        }
        totals.usage = {key: round(v, 8) if isinstance(v, float) else v for key, v in self.usage.items()}
        return totals


def _second_pass(
    folder: RunFolder, warn, chosen: set[int], pairs: list, count_written, write_best: bool, tokens: bool
) -> None:
    """Write the best samples (when `write_best`) and the preference pairs, reading the lines they are
    on. A pair is written as soon as both its samples have been read."""
    wanted = {position: index for index, both in enumerate(pairs) for position in (both[0].position, both[1].position)}
    halves: dict[int, dict[int, dict]] = {}  # pair index -> position -> record

    def write(trajectories, preferences, ids=None) -> None:
        for position, (line, record) in enumerate(folder.batch_lines(warn)):
            if position in wanted:
                index = wanted[position]
                found = halves.setdefault(index, {})
                found[position] = record
                if len(found) == 2:
                    chosen_at, rejected_at = pairs[index][0].position, pairs[index][1].position
                    line_out = preference_line(found[chosen_at], found[rejected_at])
                    preferences.write(dumps(line_out) + b"\n")
                    del halves[index]
            if position in chosen and trajectories is not None:
                if ids is not None:
                    ids.write(token_line(record))
                trajectories.write(_clean(line, dict(record)))
                count_written(record)

    if write_best and not pairs:
        write_with_tokens(folder, tokens, lambda t, ids: write(t, None, ids))
    elif write_best:
        write_with_tokens(folder, tokens, lambda t, ids: write_atomic(folder.preferences, lambda p: write(t, p, ids)))
    else:
        write_atomic(folder.preferences, lambda p: write(None, p))
