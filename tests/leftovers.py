"""What the runs of a test session left on this machine, removed at the session's end.

A run killed with SIGKILL leaves its samples' disks and /tmp mounts, cgroups and workspaces (and what
still runs in those cgroups) for the next run of its folder to remove (remove_leftovers). A test that kills
a run and does not run it again leaves them all: mounted disks hold loop devices, and every bwrap command
of a later run without a disk copies the host's whole mount table (a machine that ran the suite for a day
had 300 such mounts, and such commands took twice the CPU). At the session's end, each run folder below the
session's temporary folder that left something is given to the backends' own remove_leftovers, as the next
run of that folder would."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from trajforge.environments.local import LocalBackend
from trajforge.environments.settings import EnvironmentSettings

PREFIX = "batch-runner-"  # then the run folder's tag (EnvironmentSettings.run_tag) and "-"
DEPTH = 6  # a run folder lies this many levels below the session's temporary folder at most


ENDED = ("run.json", "trajectories.jsonl")  # a run folder whose run ended (an environment's own test makes neither)
REPORT = "leftovers.txt"  # in a session's (an xdist worker's) temporary folder: the run folders it cleaned


def remove_leftovers(basetemp: Path) -> None:
    """Every run folder below `basetemp` whose tag names something in the temporary folder: its leftovers
    removed (bwrap's are local's: BwrapBackend keeps LocalBackend's), and the folder named in REPORT."""
    names = os.listdir(tempfile.gettempdir())
    tags = {name[len(PREFIX) :].split("-", 1)[0] for name in names if name.startswith(PREFIX)}
    cleaned = []
    for folder in _folders(basetemp):
        settings = EnvironmentSettings(run_dir=folder)
        if settings.run_tag in tags:
            LocalBackend.remove_leftovers(settings)
            cleaned.append(folder)
    if cleaned:
        (basetemp / REPORT).write_text("".join(f"{folder}\n" for folder in cleaned))


def summary(basetemp: Path) -> list[str]:
    """Lines for the session's summary: the run folders whose leftovers went, those of runs that ended (their
    trajectories merged) apart: a run that ends leaves nothing, so one of them is a leak to look into."""
    cleaned = [line for report in basetemp.rglob(REPORT) for line in report.read_text().splitlines()]
    if not cleaned:
        return []
    ended = [folder for folder in cleaned if all(os.path.exists(os.path.join(folder, name)) for name in ENDED)]
    lines = [f"leftovers removed for {len(cleaned)} run folder(s) of killed runs (listed in {basetemp}/**/{REPORT})"]
    return lines + [f"LEFTOVERS OF A RUN THAT ENDED (a leak?): {folder}" for folder in ended]


def _folders(top: Path) -> Iterator[str]:
    """The folders below `top`, DEPTH levels deep at most, links not followed."""
    below = [(str(top), 0)]
    while below:
        folder, depth = below.pop()
        yield folder
        if depth == DEPTH:
            continue
        try:
            with os.scandir(folder) as listing:
                below += [(entry.path, depth + 1) for entry in listing if entry.is_dir(follow_symlinks=False)]
        except OSError:  # removed meanwhile, or not ours to read
            continue
