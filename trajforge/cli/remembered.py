"""What a run folder remembers of its run (run.json): the settings that shape the data, kept by the
first invocation so that --resume goes on with the same ones. Which flags, and their rules, come from
trajforge.cli.flagtable; config.RUN_SETTINGS holds the rows with their checks."""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trajforge.errors import UsageError


def digest(value) -> str:
    """A JSON value's fingerprint: run.json keeps this of a secret, never the text."""
    return "sha256:" + hashlib.sha256(json.dumps(value, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def itself(value, flag: str = ""):
    return value


def _text(value, flag: str) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Remembered:
    """A flag that shapes the data: the run's first invocation keeps its value in run.json, and --resume
    takes it from there when the flag is left out, and refuses a different one."""

    flag: str
    default: object  # when neither the command line nor run.json gives it
    normal: Callable = _text  # (flag value, flag) -> what run.json keeps (JSON)
    restore: Callable = itself  # (what run.json keeps, flag) -> the flag value that --resume runs with
    # (kept, now) -> may a resume go on with `now`? Equality; a setting that may grow on a resume (such as
    # a number of samples per prompt) says so here, and run.json then keeps the new value.
    agrees: Callable = operator.eq
    # A flag that may change on a resume (workers, prices, budget): run.json's value is only the default.
    may_change: bool = False


def settle_flags(rows: tuple[Remembered, ...], flags: dict, kept: dict | None, where: Path | None) -> dict:
    """The flags this invocation runs with. A remembered flag left out (None) takes its value from
    `kept` (run.json of the run being resumed, at `where`), else its default; one given must agree with
    `kept`. Raises UsageError naming the flag and both values."""
    flags = dict(flags)
    for row in rows:
        given = flags[row.flag]
        if kept is None or row.flag not in kept:  # a run folder from before, or a setting added since
            flags[row.flag] = row.default if given is None else given
            continue
        stored = kept[row.flag]
        damaged = UsageError(f"{where}: {row.flag} holds {stored!r}, which --{row.flag} cannot take")
        try:  # restore() refuses by itself what must come again (a secret)
            value = given if given is not None else row.restore(stored, row.flag)
        except (TypeError, KeyError, AttributeError):  # a run.json edited by hand, or damaged
            raise damaged from None
        try:
            now = row.normal(value, row.flag)
            agrees = row.agrees(stored, now)
        except UsageError as exc:
            if given is not None:
                raise
            raise UsageError(f"{where}: {row.flag} holds {stored!r}: {exc}") from None
        except (TypeError, KeyError, AttributeError):
            raise damaged from None
        if not agrees and not (row.may_change and given is not None):
            shown = json.dumps(stored, ensure_ascii=False)
            if given is None:  # restored, but not the same: a prefill file that changed, a damaged run.json
                raise UsageError(f"--{row.flag}: the run (in {where}) was made with {shown}, which now reads {now!r}")
            raise UsageError(
                f"--{row.flag}: this run (in {where}) was made with {shown}; --resume gave "
                f"{json.dumps(now, ensure_ascii=False)}. Leave the flag out to go on with the run's value, "
                "or start a new --run_name"
            )
        flags[row.flag] = value
    return flags


def changes(rows: tuple[Remembered, ...], flags: dict, kept: dict | None) -> list[str]:
    """What this invocation changes of a may-change setting of the run, as people read it:
    "--max_cost: 1.0 -> 2.0". `flags` are the settled ones."""
    out = []
    for row in rows:
        if row.may_change and kept is not None and row.flag in kept:
            now = row.normal(flags[row.flag], row.flag)
            if not row.agrees(kept[row.flag], now):
                out.append(f"--{row.flag}: {_shown(kept[row.flag])} -> {_shown(now)}")
    return out


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if round(value, 2) == value else f"{value:g}"
    return "none" if value is None else str(value)


def remembered(rows: tuple[Remembered, ...], flags: dict) -> dict:
    """What run.json keeps of settled flags."""
    return {row.flag: row.normal(flags[row.flag], row.flag) for row in rows}
