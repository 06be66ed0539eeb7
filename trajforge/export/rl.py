"""export/rl.jsonl (and export/rl.parquet when parquet is asked too): trainer rows built from the token
ids of tokens.jsonl, never from text run through a chat template again.

A row is one continuous segment of a trajectory: `prompt_ids` (its first request's prompt), then
`response_ids`, everything after it up to the end of its last completion: each completion's ids (mask 1,
their logprobs) and between them the ids the server's template inserted (tool results, role headers:
mask 0, logprob 0.0). A segment goes on while each request's prompt ids start with the segment so far;
where they do not (the template drifted) or a turn has no ids, the next turn starts a new segment.
"""

from __future__ import annotations

from pathlib import Path

from trajectory import known_reward
from trajforge.export.files import JsonLines
from trajforge.journal.sample import Sample

PARQUET_FILE = "rl.parquet"


def segments(turns: list[dict]) -> list[dict]:
    """The continuous segments of a trajectory's turns (tokens.jsonl `turns`), as row fields."""
    rows: list[dict] = []
    current: dict | None = None
    for turn in turns:
        prompt, completion = turn.get("prompt_token_ids"), turn.get("token_ids")
        if prompt is None or completion is None:
            current = None
            continue
        logprobs = turn.get("logprobs")
        if logprobs is None or len(logprobs) != len(completion):  # ids without logprobs: none to train on
            logprobs = [0.0] * len(completion)
        so_far = current["prompt_ids"] + current["response_ids"] if current is not None else []
        if current is not None and prompt[: len(so_far)] == so_far:
            inserted = prompt[len(so_far) :]
            current["response_ids"] += inserted
            current["response_mask"] += [0] * len(inserted)
            current["response_logprobs"] += [0.0] * len(inserted)
        else:
            current = {"prompt_ids": prompt, "response_ids": [], "response_mask": [], "response_logprobs": []}
            rows.append(current)
        current["response_ids"] += completion
        current["response_mask"] += [1] * len(completion)
        current["response_logprobs"] += [float(value) for value in logprobs]
    return rows


def rows(sample: Sample) -> list[dict]:
    """The rows of one sample, from the token ids it was journalled with (tokens.jsonl has the same)."""
    key = {
        "reward": known_reward(sample.verification),  # null when unverified, as in openai.jsonl
        "prompt_index": sample.prompt_index,
        "sample_index": sample.sample_index,
    }
    turns = (sample.tokens or {}).get("turns") or []
    return [fields | key | {"segment": n} for n, fields in enumerate(segments(turns))]


class RlFile:
    """The rows of every sample trajectories.jsonl gets, in its order."""

    def __init__(self, path: Path, parquet: bool):
        self.out = JsonLines(path)
        self.table = _parquet(path.parent / PARQUET_FILE) if parquet else None

    def write(self, sample: Sample) -> None:
        for row in rows(sample):
            self.out.write(row)
            if self.table:
                self.table.write(row)

    def commit(self) -> None:
        self.out.commit()
        if self.table:
            self.table.commit()

    def abort(self) -> None:
        self.out.abort()
        if self.table:
            self.table.abort()


def _parquet(path: Path):
    """rl.parquet: the same rows with fixed types (pyarrow only when asked: a second to import)."""
    import pyarrow as pa

    from trajforge.export.parquet import ParquetFile

    ids = pa.list_(pa.int64())
    schema = pa.schema(
        [
            ("prompt_ids", ids),
            ("response_ids", ids),
            ("response_mask", pa.list_(pa.int8())),
            ("response_logprobs", pa.list_(pa.float64())),
            ("reward", pa.float64()),
            ("prompt_index", pa.int64()),
            ("sample_index", pa.int64()),
            ("segment", pa.int64()),
        ]
    )
    return ParquetFile(path, schema, lambda row: row)
