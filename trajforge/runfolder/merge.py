"""Merge every batch file into trajectories.jsonl (and preferences.jsonl), applying the filters and
--keep, and total up statistics.

A pure filter over batch files: a later run can merge again with other settings without calling the
model. It streams line by line, so memory stays flat however large the run folder is; --keep=best and
preference pairs read the files a second time, parsing only the lines the first pass chose. Every row's
tool_stats has the same keys, `tool_names`: a tool a row lacks (one only some samples' MCP servers listed,
see listed_tool_names) is filled in with zeros.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from trajectory import known_cost, verification_passed
from trajforge import journal
from trajforge.journal.rescored import Where
from trajforge.journal.sample import Sample
from trajforge.runfolder.folder import RunFolder, entry_key, write_atomic
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
    replay_diverged: int = 0  # samples whose newest verification (--rescore) found a replayed call diverged
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


ZERO = {"count": 0, "success": 0, "failure": 0}


def listed_tool_names(folder: RunFolder, tool_names: list[str]) -> list[str]:
    """`tool_names` and every other tool a finished sample's tool_stats has (one its MCP servers listed for
    it alone), sorted: a pass over the batch files, for a run whose samples list their own tools."""
    found = set(tool_names)
    for _, record in folder.batch_lines(lambda _: None):  # the merge's own pass warns of a torn line
        found.update(record.get("tool_stats") or {})
    return sorted(found)


def merge(
    folder: RunFolder,
    require_reasoning: bool,
    tool_names: list[str],
    warn: Callable[[str], None],
    keep: str = "all",
    observe: Callable[[Sample, str | None], None] | None = None,
    tokens: bool = False,
    written: Callable[[Sample], None] | None = None,
) -> TrajectoryTotals:
    """`observe(sample, why it was dropped or None)` sees every finished sample (the report's data),
    `written(sample)` each one written to trajectories.jsonl, in its order (the exports); with `tokens`,
    tokens.jsonl gets a line for each line of trajectories.jsonl."""
    run = Merge(folder, require_reasoning, tool_names, warn, keep, observe, written)
    if keep == "best":
        run.first_pass(None)
    else:
        write_with_tokens(folder, tokens, run.first_pass)
    chosen = {c.position for c in map(best, run.candidates.values()) if c} if keep == "best" else set()
    pairs = [found for found in map(pair, run.candidates.values()) if found]
    if keep == "best" or pairs:
        _second_pass(folder, warn, chosen, pairs, run.write, keep == "best", tokens)
    if not pairs:  # no pair now: none from an earlier merge, and no empty file `datasets` cannot load
        folder.preferences.unlink(missing_ok=True)
    return run.result(len(pairs))


class Merge:
    """One merge's counts over every line of the batch files (the first pass reads each once), and the
    totals they add up to."""

    def __init__(
        self, folder: RunFolder, require_reasoning: bool, tool_names: list[str], warn, keep: str, observe, written
    ):
        self.folder = folder
        self.require_reasoning = require_reasoning
        self.warn = warn
        self.keep = keep  # all, passed or best (best: written by the second pass)
        self.observe = observe
        self.sink = written
        self.totals = TrajectoryTotals()
        self.tool_names = frozenset(tool_names)  # what fill compares each row's tools with
        self.tools = {name: dict(ZERO) for name in tool_names}
        self.turns = self.with_reasoning = 0
        self.usage: dict = {}
        self.exits: Counter = Counter()
        self.verified = Verified()
        self.candidates: dict[str, list[Candidate]] = {}  # verified samples the filters keep, by entry key

    def write(self, sample: Sample, handle, ids) -> None:
        """The sample into trajectories.jsonl (`handle`), its token ids into tokens.jsonl (`ids`), to the sink."""
        self.fill(sample)
        if ids is not None:
            ids.write(token_line(sample))
        handle.write(sample.trajectory_line())
        self.totals.trajectories += 1
        self.totals.completed += sample.completed
        self.totals.partial += sample.partial
        if self.sink is not None:
            self.sink(sample)

    def first_pass(self, handle, ids=None) -> None:
        """Count every line; write those `keep` keeps to `handle` (and their token lines to `ids`)."""
        for position, line, record in self.folder.located_lines(self.warn):
            sample = journal.read(record, line)
            self.fill(sample)
            key = entry_key(sample.entry)
            passed = verification_passed(sample.verification)
            reason = self.count(sample, key, passed)
            if self.observe is not None:
                self.observe(sample, reason)
            if reason is not None:
                continue
            if passed is not None:
                reward = sample.verification.get("reward") or 0.0
                self.candidates.setdefault(key, []).append(
                    Candidate(position, passed, reward, sample.api_calls, sample.sample_index)
                )
            if handle is not None and (self.keep == "all" or (self.keep == "passed" and passed)):
                self.write(sample, handle, ids)

    def fill(self, sample: Sample) -> None:
        """Its tool_stats over every tool of the run, zeros for one it was not offered (a version-1 line's
        record stays as it was written)."""
        stats = sample.tool_stats
        if sample.legacy is None and not stats.keys() >= self.tool_names:
            sample.tool_stats = {name: stats.get(name) or dict(ZERO) for name in sorted({*self.tool_names, *stats})}

    def count(self, sample: Sample, key: str, passed: bool | None) -> str | None:
        """Add a finished sample to the counts; why it stays out of trajectories.jsonl (None: it may go in)."""
        totals = self.totals
        self.turns += len(sample.turns)
        self.with_reasoning += sum(1 for turn in sample.turns if turn.reasoning)
        stats, tools = sample.tool_stats, self.tools
        if not tools.keys() >= stats.keys():  # a tool the run cannot offer now (a plugin's, in an earlier invocation)
            tools.update((name, dict(ZERO)) for name in stats.keys() - tools.keys())
        for name, entry in stats.items():
            if entry != ZERO:  # most of a row's tools were not called (one comparison, made in C)
                known = tools[name]
                known["count"] += entry["count"]
                known["success"] += entry["success"]
                known["failure"] += entry["failure"]
        _sum_usage(self.usage, sample.usage, totals)
        totals.finished[key, sample.sample_index] += 1
        if passed is not None:
            self.verified.add(key, sample.verification, passed)
            totals.replay_diverged += bool(sample.verification.get("replay_diverged"))
            totals.passed[key, sample.sample_index] += passed
        totals.tokens.add(sample)
        if sample.nonzero_exits:  # most have none (Counter.update costs even then)
            self.exits.update(sample.nonzero_exits)
        for kind, count in sample.redactions.items():
            totals.redactions[kind] = totals.redactions.get(kind, 0) + count
        reason = sample.discarded
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
    folder: RunFolder, warn, chosen: set[Where], pairs: list, write_sample, write_best: bool, tokens: bool
) -> None:
    """Write the best samples (when `write_best`) and the preference pairs, reading the lines they are
    on. A pair is written as soon as both its samples have been read."""
    wanted = {position: index for index, both in enumerate(pairs) for position in (both[0].position, both[1].position)}
    halves: dict[int, dict[Where, Sample]] = {}  # pair index -> position -> sample

    def write(trajectories, preferences, ids=None) -> None:
        for position, line, record in folder.located_lines(warn, only=wanted.keys() | chosen):
            sample = journal.read(record, line)
            if position in wanted:
                index = wanted[position]
                found = halves.setdefault(index, {})
                found[position] = sample
                if len(found) == 2:
                    chosen_at, rejected_at = pairs[index][0].position, pairs[index][1].position
                    line_out = preference_line(found[chosen_at], found[rejected_at])
                    preferences.write(dumps(line_out) + b"\n")
                    del halves[index]
            if position in chosen and trajectories is not None:
                write_sample(sample, trajectories, ids)

    if write_best and not pairs:
        write_with_tokens(folder, tokens, lambda t, ids: write(t, None, ids))
    elif write_best:
        write_with_tokens(folder, tokens, lambda t, ids: write_atomic(folder.preferences, lambda p: write(t, p, ids)))
    else:
        write_atomic(folder.preferences, lambda p: write(None, p))
