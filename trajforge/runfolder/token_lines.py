"""tokens.jsonl beside trajectories.jsonl (--token_ids): the token ids each batch-file line carries
under its own key `tokens`, written line for line with the trajectories the merge keeps, and counted
for statistics.json."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from trajforge.journal.sample import Sample
from trajforge.runfolder.folder import RunFolder, write_atomic


def token_line(sample: Sample) -> bytes:
    """The tokens.jsonl line of a sample: {prompt_index, sample_index, turns}, a turn per model call
    ({prompt_token_ids, token_ids, logprobs}, None where the server sent none). A sample finished
    without --token_ids (a folder from before) has no turns."""
    turns = (sample.tokens or {}).get("turns") or []
    line = {"prompt_index": sample.prompt_index, "sample_index": sample.sample_index}
    return orjson.dumps(line | {"turns": turns}) + b"\n"


def drift_of(sample: Sample) -> list[int]:
    """The sample's token_drift as a list (JSON text in the record; absent in older folders)."""
    text = sample.token_drift
    value = orjson.loads(text) if isinstance(text, str) and text else text  # orjson: every record has one
    return value if isinstance(value, list) else []


@dataclass
class TokenTotals:
    """statistics.json `token_ids`, over every finished sample; `missing` is the first reply's
    description that came without ids (the runner warns with it once)."""

    samples: int = 0  # samples with token data
    turns: int = 0
    turns_without_ids: int = 0
    drifted_turns: int = 0
    samples_with_drift: int = 0
    missing: str = field(default="", repr=False)

    def add(self, sample: Sample) -> None:
        tokens = sample.tokens
        drifted = drift_of(sample)
        self.drifted_turns += len(drifted)
        self.samples_with_drift += bool(drifted)
        if not isinstance(tokens, dict):
            return
        self.samples += 1
        for turn in tokens.get("turns") or []:
            self.turns += 1
            self.turns_without_ids += None in (turn.get("prompt_token_ids"), turn.get("token_ids"))
        self.missing = self.missing or tokens.get("missing") or ""

    def statistics(self) -> dict:
        return {
            "samples": self.samples,
            "turns": self.turns,
            "turns_without_ids": self.turns_without_ids,
            "drifted_turns": self.drifted_turns,
            "samples_with_drift": self.samples_with_drift,
        }


def write_with_tokens(folder: RunFolder, tokens: bool, write: Callable) -> None:
    """write(trajectories handle, tokens handle or None), both files replaced atomically."""
    if tokens:
        write_atomic(folder.trajectories, lambda lines: write_atomic(folder.tokens, lambda ids: write(lines, ids)))
    else:
        write_atomic(folder.trajectories, lambda lines: write(lines, None))
