"""Verification of a finished sample, in its own still-open environment, after the agent's last turn.

What checks a sample: `--verifier=file.py:function` when given, else the entry's `verify` field: a shell
command (its last output line, when a number, is the reward; else exit 0 is 1.0), or an object of checks
(`command`, `final_contains`, `final_excludes`, `tools_called`). Nothing of it enters the conversation
or tool_stats. A verifier that fails in any way (raises, times out, answers garbage) gives a sample that
did not pass, with the error recorded: the sample is saved all the same.

The result is always the same dict, `{verified, passed, reward, output, duration_seconds, error}`, of
the same types in every record: an unverified sample has `verified: false` and placeholders (false, 0.0,
"", 0.0, ""), a verification without error an empty `error`. A null would make a column's type depend
on which rows a file holds (docs/record.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from trajectory import Turn
from trajforge.environments import Environment
from trajforge.verification.result import VerifySettings, capped, result, unverified
from trajforge.verification.tasks import reveal_tests

View = Callable[[], dict]  # the sample's record so far, made when a Python verifier asks for it

CHECKS = ("command", "final_contains", "final_excludes", "tools_called")


def spec_problem(spec) -> str | None:
    """Why a dataset entry's `verify` value cannot be used, or None."""
    if isinstance(spec, str):
        return None if spec.strip() else '"verify" must be a non-empty command'
    if not isinstance(spec, dict):
        return f'"verify" must be a command (string) or an object of checks, got {type(spec).__name__}'
    unknown = sorted(set(spec) - set(CHECKS))
    if unknown:
        return f'"verify" has unknown check(s) {", ".join(map(repr, unknown))}; known: {", ".join(CHECKS)}'
    if not spec:
        return f'"verify" needs at least one of {", ".join(CHECKS)}'
    if "command" in spec and not (isinstance(spec["command"], str) and spec["command"].strip()):
        return '"verify.command" must be a non-empty string'
    for name in CHECKS[1:]:
        value = spec.get(name, [])
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            return f'"verify.{name}" must be a list of non-empty strings'
    return None


def number(text: str) -> float | None:
    """A finite number written alone on a line, else None."""
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def command_reward(output: str, exit_code: int) -> float:
    """The last non-empty line of the output when it is a number; else 1.0 for exit 0, 0.0 otherwise."""
    lines = [line for line in output.splitlines() if line.strip()]
    found = number(lines[-1]) if lines else None
    if found is not None:
        return found
    return 1.0 if exit_code == 0 else 0.0


def final_answer(turns: list[Turn]) -> str:
    return turns[-1].content if turns else ""


def check_failures(spec: dict, turns: list[Turn]) -> list[str]:
    """The checks of an object spec (other than its command) that do not hold, each said in words."""
    final = final_answer(turns)
    called = {call.name for turn in turns for call in turn.calls}
    failures = [f"final answer lacks {text!r}" for text in spec.get("final_contains", []) if text not in final]
    failures += [f"final answer contains {text!r}" for text in spec.get("final_excludes", []) if text in final]
    failures += [f"tool {name!r} was not called" for name in spec.get("tools_called", []) if name not in called]
    return failures


async def run_command(env: Environment, command: str, timeout: float, threshold: float, started: float) -> dict:
    done = await env.exec(command, timeout, capped=False)
    if done.timed_out:
        return result(False, 0.0, done.output, started, f"verify command timed out after {timeout:g}s")
    reward = command_reward(done.output, done.exit_code)
    return result(done.exit_code == 0 and reward >= threshold, reward, done.output, started)


async def verify_sample(
    settings: VerifySettings, entry: dict, view: View, turns: list[Turn], env, base: Path | None = None
) -> dict:
    """The verification of one finished sample (unverified() when nothing checks it). `view` gives the
    record a Python verifier is shown (built only for one); `env` is the sample's environment, still open;
    `base` the dataset file's folder (a `tests` directory is relative to it). Never raises: a verification
    that breaks is a sample that did not pass, with the error recorded."""
    started = time.monotonic()
    try:
        return await _verify(settings, entry, view, turns, env, started, base or Path())
    except Exception as exc:  # e.g. the container vanished under the verify command
        return result(False, 0.0, "", started, f"verification failed: {type(exc).__name__}: {exc}")


async def _verify(
    settings: VerifySettings, entry: dict, view: View, turns: list[Turn], env, started: float, base: Path
) -> dict:
    """The verification's steps, in order; each later one relies on those before it."""
    spec = entry.get("verify")
    if not settings.verifier and spec is None:
        return unverified()
    # 1. The clean room: the agent's processes gone, escapes out of the workspace removed, and from here
    #    on every command with a fresh HOME, no user site, no cwd on sys.path, its text on stdin.
    removed = await env.enter_clean_room()
    # 2. The task's hidden tests, written only now into a fresh folder outside the workspace ($TESTS_DIR).
    await reveal_tests(env, entry, base)
    # 3. The check itself: the Python verifier, or the entry's `verify`.
    done = await _check(settings, spec, view, turns, env, started)
    # 4. Its reward must lie in --reward_range: a verifier printing 100000 has not measured a solution.
    done = in_range(done, settings.reward_range)
    return {**done, "output": capped(removed + (done["output"] or ""))} if removed else done


async def _check(settings: VerifySettings, spec, view: View, turns: list[Turn], env, started: float) -> dict:
    if settings.verifier:
        from trajforge.verification.python_verifier import call_verifier  # forks: loaded only by runs that have one

        return await call_verifier(settings, view(), env, started)
    if isinstance(spec, str):
        return await run_command(env, spec, settings.timeout, settings.threshold, started)
    failures = check_failures(spec, turns)
    if failures:
        return result(False, 0.0, "\n".join(failures), started)
    if "command" in spec:
        return await run_command(env, spec["command"], settings.timeout, settings.threshold, started)
    return result(settings.threshold <= 1.0, 1.0, "every check holds", started)


def in_range(done: dict, bounds: tuple[float, float]) -> dict:
    """The verification, or a verification error when its reward lies outside `bounds`."""
    low, high = bounds
    if low <= done["reward"] <= high:
        return done
    error = f"reward {done['reward']:g} is outside --reward_range {low:g},{high:g}"
    return {**done, "passed": False, "reward": 0.0, "error": error}  # 0.0: the record's no-null placeholder
