"""The journal: a finished sample as a typed object (sample.py) and its line in a batch file. A line
says its version; lines without one were written before the journal and are read by v1.py."""

from __future__ import annotations

import json

from trajforge.journal import v1
from trajforge.journal.offered import loads
from trajforge.journal.sample import VERSION, Sample, from_journal

__all__ = ["VERSION", "Sample", "entry_of", "loads", "read", "sample_index_of", "verification_of"]


def read(record: dict, line: bytes) -> Sample:
    """The sample of a batch line (`record`: the line as orjson read it; the v1 reader changes it)."""
    version = record.get("version", 1)
    if version == VERSION:
        return from_journal(record)
    if version == 1:
        return v1.read(record, line)
    raise ValueError(f"a batch line of version {version!r}, newer than this batch-runner reads ({VERSION})")


def entry_of(record: dict) -> dict:
    """The dataset entry of a batch line of any version, without reading the rest of it."""
    if "version" in record:
        return record["entry"]
    source = record["metadata"]["source"]
    return json.loads(source) if isinstance(source, str) else source  # a dict in the oldest records


def sample_index_of(record: dict) -> int:
    if "version" in record:
        return record["sample_index"]
    return record["metadata"].get("sample_index", 0)  # records from before samples are 0


def verification_of(record: dict) -> dict | None:
    if "version" in record:
        return record["verification"]
    return record["metadata"].get("verification")
