"""Verification of a finished sample, in its own still-open environment, after the agent's last turn.

What checks a sample: `--verifier=file.py:function` when given, else the entry's `verify` field: a shell
command (its last output line, when a number, is the reward; else exit 0 is 1.0), or an object of checks
(`command`, `final_contains`, `final_excludes`, `tools_called`, and any a plugin registers: kinds.py).
Nothing of it enters the conversation or tool_stats. A verifier that fails in any way (raises, times out,
answers garbage) gives a sample that did not pass, with the error recorded: the sample is saved all the same.

The result is always the same dict, `{verified, passed, reward, output, duration_seconds, error}`, of
the same types in every record: an unverified sample has `verified: false` and placeholders (false, 0.0,
"", 0.0, ""), a verification without error an empty `error`. A null would make a column's type depend
on which rows a file holds (docs/record.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from trajectory import Turn
from trajforge.environments.folder_task import FolderSettings
from trajforge.model.outcomes import ModelCallFailed, RunStopped
from trajforge.money.errors import SpendStop
from trajforge.verification.host_folders import NO_FOLDERS, HostFolders
from trajforge.verification.kinds import CheckContext, check_object
from trajforge.verification.result import VerifySettings, capped, result, unverified
from trajforge.verification.task_folder import verify_folder
from trajforge.verification.tasks import reveal_tests

View = Callable[[], dict]  # the sample's record so far, made when a Python verifier asks for it


async def verify_sample(
    settings: VerifySettings,
    entry: dict,
    view: View,
    turns: list[Turn],
    env,
    folders: HostFolders = NO_FOLDERS,
    session: Any = None,
) -> dict:
    """The verification of one finished sample (unverified() when nothing checks it). `view` gives the
    record a Python verifier is shown (built only for one); `env` is the sample's environment, still open;
    `folders` where a `tests` directory may lie and how it is read. Never raises: a verification
    that breaks is a sample that did not pass, with the error recorded; but a judge's model call that the
    budget stops or that fails for good stops or fails the sample as an agent's call does (a resume runs it
    again, its paid calls from the cache)."""
    started = time.monotonic()
    try:
        return await _verify(
            settings, entry, view, CheckContext(entry, turns, env, settings, session), started, folders
        )
    except (SpendStop, RunStopped, ModelCallFailed):  # a judge's call: the sample stops or fails as the agent's would
        raise
    except Exception as exc:  # e.g. the container vanished under the verify command
        return result(False, 0.0, "", started, f"verification failed: {type(exc).__name__}: {exc}")


def verifies(settings: VerifySettings, entry: dict) -> bool:
    """Whether anything checks a sample of `entry`: its task folder's tests, --verifier, --judge or its `verify`."""
    if FolderSettings.of(entry) or settings.verifier:
        return True
    return settings.judge is not None or entry.get("verify") is not None


async def _verify(
    settings: VerifySettings, entry: dict, view: View, context: CheckContext, started: float, folders: HostFolders
) -> dict:
    """The verification's steps, in order; each later one relies on those before it."""
    if FolderSettings.of(entry):  # a task folder: its tests/test.sh in a fresh container (task_folder.py)
        return in_range(await verify_folder(settings, entry, context.env, started), settings.reward_range)
    spec = entry.get("verify")
    if not verifies(settings, entry):
        return unverified()
    if settings.judge is not None:  # --judge: beside the entry's own checks, in place of its own judge
        own = spec if isinstance(spec, dict) else {} if spec is None else {"command": spec}
        spec = own | {"judge": settings.judge}
    # 0. Where it runs: the sample's environment, or a fresh container of its image holding only the work
    #    folder (docker: the agent was root in its own, so what it changed outside the work folder stays there).
    room = await context.env.verification_room()
    try:
        return await _checked(settings, spec, view, replace(context, env=room), started, folders)
    finally:
        if room is not context.env:
            await room.close()


async def _checked(
    settings: VerifySettings, spec: Any, view: View, context: CheckContext, started: float, folders: HostFolders
) -> dict:
    """The verification in `context.env`, the room it runs in."""
    # 1. The clean room: the agent's processes gone, escapes out of the workspace removed, and from here
    #    on every command with a fresh HOME, no user site, no cwd on sys.path, its text on stdin.
    removed = await context.env.enter_clean_room()
    # 2. The task's hidden tests, written only now into a fresh folder outside the workspace ($TESTS_DIR).
    await reveal_tests(context.env, context.entry, folders)
    # 3. The check itself: the Python verifier, or the entry's `verify` (a command: an object of that alone).
    if settings.verifier:
        from trajforge.verification.python_verifier import call_verifier  # forks: loaded only by runs that have one

        done = await call_verifier(settings, view(), context.env, started)
    else:
        done = await check_object(spec if isinstance(spec, dict) else {"command": spec}, context, started)
    # 4. Its reward must lie in --reward_range: a verifier printing 100000 has not measured a solution.
    done = in_range(done, settings.reward_range)
    return {**done, "output": capped(removed + (done["output"] or ""))} if removed else done


def in_range(done: dict, bounds: tuple[float, float]) -> dict:
    """The verification, or a verification error when its reward lies outside `bounds`."""
    low, high = bounds
    if low <= done["reward"] <= high:
        return done
    error = f"reward {done['reward']:g} is outside --reward_range {low:g},{high:g}"
    return {**done, "passed": False, "reward": 0.0, "error": error}  # 0.0: the record's no-null placeholder
