"""What a run folder remembers of its run (run.json): the settings that shape the data, kept by the
first invocation so that --resume goes on with the same ones. Which flags, and how each is read, kept
and compared, come from the flag table (trajforge/flags); config.RUN_SETTINGS holds the kept ones."""

from __future__ import annotations

import json
from pathlib import Path

from trajforge.errors import UsageError
from trajforge.flags import Flag
from trajforge.flags.values import FlagError


def settle_flags(rows: tuple[Flag, ...], flags: dict, kept: dict | None, where: Path | None) -> dict:
    """The flags this invocation runs with. A remembered flag left out (None) takes its value from
    `kept` (run.json of the run being resumed, at `where`), else its default; one given must agree with
    `kept`. Raises UsageError naming the flag and both values."""
    flags = dict(flags)
    for row in rows:
        given = flags[row.name]
        if kept is None or row.name not in kept:  # a run folder from before, or a setting added since
            flags[row.name] = row.default if given is None else given
            continue
        stored = kept[row.name]
        damaged = UsageError(f"{where}: {row.name} holds {stored!r}, which --{row.name} cannot take")
        try:  # restore() refuses by itself what must come again (a secret)
            value = given if given is not None else row.restore(stored, row.name)
        except FlagError as exc:
            raise UsageError(str(exc)) from None
        except (TypeError, KeyError, AttributeError):  # a run.json edited by hand, or damaged
            raise damaged from None
        try:
            now = row.normal(value)
            agrees = row.agrees(stored, now)
        except FlagError as exc:
            if given is not None:
                raise UsageError(str(exc)) from None
            raise UsageError(f"{where}: {row.name} holds {stored!r}: {exc}") from None
        except (TypeError, KeyError, AttributeError):
            raise damaged from None
        if not agrees and not (row.may_change and given is not None):
            shown = json.dumps(stored, ensure_ascii=False)
            if given is None:  # restored, but not the same: a prefill file that changed, a damaged run.json
                raise UsageError(f"--{row.name}: the run (in {where}) was made with {shown}, which now reads {now!r}")
            raise UsageError(
                f"--{row.name}: this run (in {where}) was made with {shown}; --resume gave "
                f"{json.dumps(now, ensure_ascii=False)}. Leave the flag out to go on with the run's value, "
                "or start a new --run_name"
            )
        flags[row.name] = value
    return flags


def changes(rows: tuple[Flag, ...], flags: dict, kept: dict | None) -> list[str]:
    """What this invocation changes of a may-change setting of the run, as people read it:
    "--max_cost: 1.0 -> 2.0". `flags` are the settled ones."""
    out = []
    for row in rows:
        if row.may_change and kept is not None and row.name in kept:
            now = row.normal(flags[row.name])
            if not row.agrees(kept[row.name], now):
                out.append(f"--{row.name}: {_shown(kept[row.name])} -> {_shown(now)}")
    return out


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if round(value, 2) == value else f"{value:g}"
    return "none" if value is None else str(value)


def remembered(rows: tuple[Flag, ...], flags: dict) -> dict:
    """What run.json keeps of settled flags."""
    return {row.name: row.normal(flags[row.name]) for row in rows}
