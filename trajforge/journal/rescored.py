"""Re-scorings (--rescore) in the journal: a re-scoring never rewrites a batch file; it appends its own
file, `rescore_N.jsonl`, one line per sample it verified again, naming the batch line it re-scores (its
file and line number) and holding the new verification and usage, and the dataset entry it was verified
as (its `tests` may be new). Whoever reads the batch lines
(RunFolder.batch_lines: the merge, --keep, the preference pairs, the card, the report, the exports and a
resume's plan) reads each sample with its newest verification; the earlier ones stay in the files."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import orjson

from trajforge.journal.sample import VERSION, Sample
from trajforge.safejson import dumps

RESCORE_FILE = re.compile(r"rescore_(\d+)\.jsonl$")
Where = tuple[str, int]  # (batch file name, line number from 1)


def files(folder: Path) -> list[tuple[int, Path]]:
    """Every re-scoring's file, oldest first."""
    if not folder.is_dir():
        return []
    found = ((RESCORE_FILE.match(p.name), p) for p in folder.iterdir())
    return sorted((int(m.group(1)), p) for m, p in found if m)


def newest(folder: Path, warn: Callable[[str], None]) -> dict[Where, dict]:
    """The newest re-scoring of each batch line that has one."""
    found: dict[Where, dict] = {}
    for _, path in files(folder):
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            try:
                found_line = orjson.loads(line)
                found[found_line["file"], found_line["line"]] = found_line
            except (orjson.JSONDecodeError, KeyError, TypeError):
                warn(f"{path.name} line {number} is incomplete (cut off by a crash?); ignoring it")
    return found


def applied(record: dict, rescore: dict) -> tuple[bytes, dict]:
    """A batch line's record with its newest verification and usage, and the line it is now."""
    if "version" in record:
        record |= {"verification": rescore["verification"], "usage": rescore["usage"], "entry": rescore["entry"]}
    else:  # a version-1 line: the record itself
        metadata = record["metadata"]
        metadata |= {"verification": rescore["verification"], "usage": rescore["usage"]}
        metadata["source"] = json.dumps(rescore["entry"], ensure_ascii=False)
        metadata["reward"] = rescore["verification"]["reward"]
    return dumps(record) + b"\n", record


def line(where: Where, sample: Sample, entry: dict, verification: dict, usage: dict, number: int) -> bytes:
    """A re-scoring's line for the sample at `where` (re-scoring `number` of the run), verified as the
    dataset's `entry` says now (its tests and checks)."""
    file, at = where
    head = {"version": VERSION, "rescore": number, "file": file, "line": at}
    head |= {"prompt_index": sample.prompt_index, "sample_index": sample.sample_index}
    return dumps(head | {"entry": entry, "verification": verification, "usage": usage}) + b"\n"
