"""The JSONL dataset: one object per line with a non-empty string `prompt`."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from trajforge import safejson
from trajforge.errors import UsageError
from trajforge.verification.host_folders import HostFolders
from trajforge.verification.kinds import spec_problem
from trajforge.verification.tasks import path_problem, task_problem

MAX_LISTED = 20
# What a system takes as a path (Linux: NAME_MAX, PATH_MAX), and levels a path may have before walking
# it recurses too deep; a name beyond them fails every prompt that uses it, so it is refused at load.
OPTIONAL_STRINGS = ("image", "docker_image", "cwd")
FOLDER_FIELDS = ("workspace", "tests")  # host folders, when a string (tests may be a mapping)
# Levels of nesting an entry may have (the entry itself is one): the run's one limit (safejson.py).
TOO_DEEP = f"{safejson.TOO_DEEP}: its trajectory could not be saved"


@dataclass(frozen=True)
class Entry:
    index: int  # 0-based position among the dataset's non-blank lines
    data: dict


def _problem(data, folders: HostFolders) -> str | None:
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return 'needs a non-empty string "prompt"' if "prompt" in data else 'has no "prompt" field'
    if "harbor" in data:  # what a task folder's entry holds (run/task_folders.py): a line cannot claim one
        return '"harbor" is the runner\'s own field for task folders (--dataset_file=FOLDER); rename it'
    for key in (key for key in OPTIONAL_STRINGS if key in data):
        if not (isinstance(data[key], str) and data[key]):
            return f'"{key}" must be a non-empty string'
        if problem := path_problem(data[key]):
            return f'"{key}" {problem}'
    if "verify" in data and (problem := spec_problem(data["verify"])):
        return problem
    if problem := task_problem(data, folders):
        return problem
    cwd = data.get("cwd")
    if cwd and not posixpath.isabs(cwd) and posixpath.normpath(cwd).split("/")[0] == "..":
        return f'"cwd" {cwd!r} leaves the workspace'
    if safejson.depth(data) > safejson.MAX_DEPTH:
        return TOO_DEEP
    try:  # what its trajectory's record will hold must be writable, or the model is paid for nothing
        orjson.dumps(data)
    except orjson.JSONEncodeError as exc:
        return f"cannot be saved in a trajectory ({exc})"
    return None


def _unreadable(entries: list[Entry], lines: list[int], folders: HostFolders) -> list[str]:
    """The entries whose `workspace` or `tests` folder the dataset file's owner cannot read whole (a root
    runner reads them with the owner's rights), named by line and field."""
    named = {
        (number, field): entry.data[field]
        for entry, number in zip(entries, lines, strict=True)
        for field in FOLDER_FIELDS
        if isinstance(entry.data.get(field), str)
    }
    why = folders.unreadable(set(named.values()))
    return [
        f'line {number}: "{field}" {folder!r}: {why[folder]}'
        for (number, field), folder in named.items()
        if folder in why
    ]


def load_dataset(path: Path, max_samples: int | None = None, task_roots: Iterable[Path] = ()) -> list[Entry]:
    """Every entry of the dataset (the first `max_samples`), or UsageError naming each bad line. An entry's
    `workspace` and `tests` folders must lie in the dataset file's folder or one of `task_roots`."""
    if not path.is_file():
        raise UsageError(f"--dataset_file: {path} does not exist or is not a file")
    entries: list[Entry] = []
    bad: list[str] = []
    lines: list[int] = []  # each entry's line number
    folders = HostFolders.of(path, task_roots)  # where an entry's `workspace` and `tests` folders may lie
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
                problem = _problem(data, folders)
                if problem:
                    bad.append(f"line {number}: {problem}")
                else:
                    entries.append(Entry(len(entries) + len(bad), data))
                    lines.append(number)
        except UnicodeDecodeError as exc:
            raise UsageError(f"--dataset_file: {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    bad += _unreadable(entries, lines, folders)
    if bad:
        shown = "\n  ".join(bad[:MAX_LISTED])
        more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
        raise UsageError(f"--dataset_file: {path} has {len(bad)} bad line(s); nothing was sent:\n  {shown}{more}")
    if not entries:
        raise UsageError(f"--dataset_file: {path} has no prompts")
    return entries
