"""The JSONL dataset: one object per line with a non-empty string `prompt`."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from pathlib import Path

import orjson

from trajforge.tasks import task_problem
from trajforge.verify import spec_problem

MAX_LISTED = 20
OPTIONAL_STRINGS = ("image", "docker_image", "cwd")
# Levels of nesting an entry may have (the entry itself is one). The record writer (orjson) stops at
# 254, and the record holds the entry a few levels down (metadata.source): a margin, not an exact fit.
MAX_DEPTH = 200
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels: its trajectory could not be saved"


class UsageError(Exception):
    """Bad arguments or dataset: printed as one message, exit status 2, no request sent."""


@dataclass(frozen=True)
class Entry:
    index: int  # 0-based position among the dataset's non-blank lines
    data: dict


def _problem(data, base: Path) -> str | None:
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return 'needs a non-empty string "prompt"' if "prompt" in data else 'has no "prompt" field'
    for key in OPTIONAL_STRINGS:
        if key in data and not (isinstance(data[key], str) and data[key]):
            return f'"{key}" must be a non-empty string'
    if "verify" in data and (problem := spec_problem(data["verify"])):
        return problem
    if problem := task_problem(data, base):
        return problem
    cwd = data.get("cwd")
    if cwd and not posixpath.isabs(cwd) and posixpath.normpath(cwd).split("/")[0] == "..":
        return f'"cwd" {cwd!r} leaves the workspace'
    if _depth(data) > MAX_DEPTH:
        return TOO_DEEP
    try:  # what its trajectory's record will hold must be writable, or the model is paid for nothing
        orjson.dumps(data)
    except orjson.JSONEncodeError as exc:
        return f"cannot be saved in a trajectory ({exc})"
    return None


def _depth(data) -> int:
    """Levels of nesting of a JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, level = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def load_dataset(path: Path, max_samples: int | None = None) -> list[Entry]:
    """Every entry of the dataset (the first `max_samples`), or UsageError naming each bad line."""
    if not path.is_file():
        raise UsageError(f"--dataset_file: {path} does not exist or is not a file")
    entries: list[Entry] = []
    bad: list[str] = []
    with open(path, encoding="utf-8-sig") as handle:  # -sig: a byte-order mark is not part of line 1
        try:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                if max_samples is not None and len(entries) >= max_samples:
                    break
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    bad.append(f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})")
                    continue
                except RecursionError:  # the parser recurses per level: thousands of levels end it
                    bad.append(f"line {number}: {TOO_DEEP}")
                    continue
                problem = _problem(data, path.resolve().parent)
                if problem:
                    bad.append(f"line {number}: {problem}")
                else:
                    entries.append(Entry(len(entries) + len(bad), data))
        except UnicodeDecodeError as exc:
            raise UsageError(f"--dataset_file: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    if bad:
        shown = "\n  ".join(bad[:MAX_LISTED])
        more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
        raise UsageError(f"--dataset_file: {path} has {len(bad)} bad line(s); nothing was sent:\n  {shown}{more}")
    if not entries:
        raise UsageError(f"--dataset_file: {path} has no prompts")
    return entries
