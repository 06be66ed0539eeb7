"""attempts.jsonl: how often each sample was tried, over every invocation on the run folder.

A worker appends a `start` line before a sample's first step (one write to a file opened O_APPEND: once
it returns, a kill -9 of any process cannot take it back), so a sample that kills the runner still used a
try. The driver appends a `release` line for a start that was not a try: the sample was interrupted
(Ctrl-C, SIGTERM), stopped by the budget, or the run stopped because the endpoint refused the key.
A release names the invocation of the start it takes back, so it never cancels a later start.

errors.jsonl lines written before this file existed (no `error_class`) each count as one try too, so a
run folder of an older version keeps the tries it had.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from trajforge.failures import ENDPOINT, failure_class
from trajforge.runfolder.folder import FILE_MODE, RunFolder, entry_key

EXHAUSTED = "exhausted"  # a held-back sample used its --max_attempts; ENDPOINT: its last failure was the endpoint's


def unit_id(key: str, sample: int, copy: int = 0) -> str:
    """One sample of one copy of an entry (its entry key), as attempts.jsonl names it: short and fixed-size,
    whatever the entry holds."""
    return f"{hashlib.sha256(key.encode()).hexdigest()[:32]}:{sample}:{copy}"


def line_unit(line: dict) -> str | None:
    """The unit of an errors.jsonl line (None when it names no entry); lines without a sample index or
    copy number (older versions) are sample 0 of the first copy."""
    source = line.get("source")
    if not isinstance(source, dict):
        return None
    sample, copy = (line.get(name, 0) for name in ("sample_index", "copy"))
    return unit_id(entry_key(source), *(n if isinstance(n, int) else 0 for n in (sample, copy)))


def new_invocation() -> str:
    return secrets.token_hex(8)


class AttemptLog:
    """The run folder's attempts.jsonl: appended by workers (starts) and the driver (releases)."""

    def __init__(self, folder: RunFolder):
        self.path = folder.path / "attempts.jsonl"

    def started(self, invocation: str, unit: str) -> None:
        self._append([{"event": "start", "unit": unit, "invocation": invocation}])

    def released(self, invocation: str, units: Iterable[str], why: str) -> None:
        lines = [{"event": "release", "unit": unit, "invocation": invocation, "why": why} for unit in units]
        if lines:
            self._append(lines)

    def _append(self, lines: list[dict]) -> None:
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        try:
            os.write(fd, data)  # one write: whole lines, never interleaved with another process's
        finally:
            os.close(fd)

    def tries(self) -> Counter:
        """unit -> starts that were not released (a torn last line, cut by a crash, is skipped)."""
        started: Counter = Counter()
        released: Counter = Counter()
        if not self.path.exists():
            return started
        with self.path.open("rb") as handle:
            for raw in handle:
                try:
                    line = json.loads(raw)
                    which = (line["unit"], line["invocation"])
                except (ValueError, KeyError, TypeError):
                    continue
                (started if line.get("event") == "start" else released)[which] += 1
        tries: Counter = Counter()
        for (unit, invocation), count in started.items():
            tries[unit] += max(count - released[(unit, invocation)], 0)
        return tries


@dataclass
class History:
    """What a resume knows of each sample's earlier tries: how many, and the class of its last failure."""

    tries: Counter = field(default_factory=Counter)  # unit -> tries
    last_class: dict[str, str] = field(default_factory=dict)  # unit -> class of its last errors.jsonl line

    @classmethod
    def read(cls, folder: RunFolder) -> History:
        history = cls(AttemptLog(folder).tries())
        for line in folder.error_lines():
            unit = line_unit(line)
            if unit is None:
                continue
            kind = line.get("error_class")
            if kind is None:  # written by a version without attempts.jsonl: the line is the try
                history.tries[unit] += 1
                kind = failure_class(str(line.get("error_type", "")))
            history.last_class[unit] = str(kind)
        return history

    def held_back(self, unit: str, max_attempts: int, retry: tuple[str, ...]) -> str | None:
        """Why a resume does not send this sample again (EXHAUSTED, ENDPOINT), or None: it does."""
        if self.tries[unit] >= max_attempts:
            return EXHAUSTED
        if self.last_class.get(unit) == ENDPOINT and ENDPOINT not in retry:
            return ENDPOINT
        return None
