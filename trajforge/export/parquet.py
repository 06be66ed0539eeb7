"""export/trajectories.parquet: the records as they are in trajectories.jsonl, with a schema fixed here
so every run, whatever its tools or dataset fields, gives the same columns and types:

- a turn is {from, value, tool_calls [{id, name, arguments}], finish_reason} (arguments as JSON text);
- `metadata.source` (the dataset entry, any keys) and `metadata.verification.output` are JSON text;
- `tool_stats` and `tool_error_counts` are lists of {tool, ...} rows instead of one field per tool.
Optional keys a record lacks are null.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from trajforge.export.files import AtomicFile
from trajforge.journal.sample import Sample
from trajforge.safejson import dumps

ROWS_PER_GROUP = 1000

CALL = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
TURN = pa.struct(
    [("from", pa.string()), ("value", pa.string()), ("tool_calls", pa.list_(CALL)), ("finish_reason", pa.string())]
)
USAGE = pa.struct(
    [(key, pa.int64()) for key in ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens")]
    + [("cached_tokens", pa.int64()), ("cost", pa.float64()), ("cost_known", pa.bool_())]
    + [("judge_tokens", pa.int64()), ("judge_cost", pa.float64())]
)
VERIFICATION = pa.struct(
    [
        ("verified", pa.bool_()),
        ("passed", pa.bool_()),
        ("reward", pa.float64()),
        ("output", pa.string()),
        ("duration_seconds", pa.float64()),
        ("error", pa.string()),
        ("replay_diverged", pa.bool_()),
    ]
)
METADATA = pa.struct(
    [
        ("batch_num", pa.int64()),
        ("timestamp", pa.string()),
        ("model", pa.string()),
        ("model_reported", pa.string()),
        ("run_name", pa.string()),
        ("duration_seconds", pa.float64()),
        ("exit_reason", pa.string()),
        ("sample_index", pa.int64()),
        ("reward", pa.float64()),
        ("usage", USAGE),
        ("verification", VERIFICATION),
        ("source", pa.string()),
        ("token_drift", pa.string()),  # JSON text of the turns where the template was not append-only
    ]
)
STAT = pa.struct([("tool", pa.string()), ("count", pa.int64()), ("success", pa.int64()), ("failure", pa.int64())])
SCHEMA = pa.schema(
    [
        ("prompt_index", pa.int64()),
        ("conversations", pa.list_(TURN)),
        ("metadata", METADATA),
        ("completed", pa.bool_()),
        ("partial", pa.bool_()),
        ("api_calls", pa.int64()),
        ("toolsets_used", pa.list_(pa.string())),
        ("tool_stats", pa.list_(STAT)),
        ("tool_error_counts", pa.list_(pa.struct([("tool", pa.string()), ("failures", pa.int64())]))),
    ]
)


def _text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return dumps(value).decode()


def _turns(record: dict, sample: Sample) -> list[dict]:
    """The record's turns, each `gpt` one with its calls from the sample (its turns, in the same order)."""
    calls = iter(sample.turns)
    out = []
    for turn in record.get("conversations") or []:
        listed = next(calls).calls if turn.get("from") == "gpt" else []
        out.append(
            {
                "from": turn.get("from"),
                "value": _text(turn.get("value")),
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in listed],
                "finish_reason": _text(turn.get("finish_reason")),
            }
        )
    return out


def _struct_fields(kind: pa.StructType, value) -> dict:
    value = value if isinstance(value, dict) else {}
    return {kind.field(i).name: value.get(kind.field(i).name) for i in range(kind.num_fields)}


def row(sample: Sample) -> dict:
    record = sample.record()
    metadata = record.get("metadata") or {}
    meta = _struct_fields(METADATA, metadata)
    meta["usage"] = _struct_fields(USAGE, metadata.get("usage"))
    verification = _struct_fields(VERIFICATION, metadata.get("verification"))
    verification["output"] = _text(verification["output"])
    verification["error"] = _text(verification["error"])
    meta["verification"] = verification
    meta["source"] = _text(metadata.get("source"))
    stats = record.get("tool_stats") or {}
    errors = record.get("tool_error_counts") or {}
    return {
        "prompt_index": record.get("prompt_index"),
        "conversations": _turns(record, sample),
        "metadata": meta,
        "completed": record.get("completed"),
        "partial": record.get("partial"),
        "api_calls": record.get("api_calls"),
        "toolsets_used": record.get("toolsets_used") or [],
        "tool_stats": [{**_struct_fields(STAT, entry), "tool": name} for name, entry in stats.items()],
        "tool_error_counts": [{"tool": name, "failures": count} for name, count in errors.items()],
    }


class ParquetFile:
    """Rows in groups of ROWS_PER_GROUP, so memory stays flat however many trajectories there are;
    `schema` and `to_row` (sample -> row) are the trajectories' unless another export gives its own."""

    def __init__(self, path: Path, schema: pa.Schema = SCHEMA, to_row=row):
        self.out = AtomicFile(path)
        self.schema, self.to_row = schema, to_row
        self.writer = pq.ParquetWriter(self.out.handle, schema, compression="zstd")
        self.rows: list[dict] = []

    def write(self, item) -> None:
        self.rows.append(self.to_row(item))
        if len(self.rows) >= ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
            self.rows = []

    def commit(self) -> None:
        self._flush()
        self.writer.close()
        self.out.commit()

    def abort(self) -> None:
        self.writer.close()
        self.out.abort()
