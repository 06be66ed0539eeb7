"""The checks a dataset's `verify` object may hold, as the registry holds them (trajforge/builtin.py
registers these by name; a plugin's are the same): `command` measures, the others are gates.

An object is checked in two steps: every gate first, and a sample failing one does not pass (reward 0,
what failed said line by line) without anything run; then every measuring check, in the registry's
order: one gives the verification; several pass together only, with the lowest reward. An object of
gates only passes with reward 1.0.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

from trajectory import Turn
from trajforge import registry
from trajforge.environments import Environment
from trajforge.registry import Verdict, VerifierKind
from trajforge.verification.result import VerifySettings, result


@dataclass(frozen=True)
class CheckContext:
    """What a check is given of the sample it checks, after the clean room and the hidden tests."""

    entry: dict  # the dataset entry
    turns: list[Turn]  # the conversation (the final answer is the last turn's content)
    env: Environment  # the sample's environment, still open
    settings: VerifySettings  # --verify_timeout, --pass_threshold, ...
    session: Any = None  # the sample's tools.session.ToolSession: what a check spends is counted on it

    @property
    def final_answer(self) -> str:
        return self.turns[-1].content if self.turns else ""


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


async def run_command(command: str, context: CheckContext) -> Verdict:
    timeout = context.settings.timeout
    done = await context.env.exec(command, timeout, capped=False)
    if done.timed_out:
        return Verdict(False, done.output, 0.0, f"verify command timed out after {timeout:g}s")
    reward = command_reward(done.output, done.exit_code)
    return Verdict(done.exit_code == 0 and reward >= context.settings.threshold, done.output, reward)


def _command_problem(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else '"verify.command" must be a non-empty string'


def _texts(name: str):
    def problem(value: Any) -> str | None:
        if isinstance(value, list) and all(isinstance(item, str) and item for item in value):
            return None
        return f'"verify.{name}" must be a list of non-empty strings'

    return problem


def _gate(failures: list[str]) -> Verdict:
    return Verdict(not failures, "\n".join(failures))


COMMAND = VerifierKind(run_command, _command_problem)
FINAL_CONTAINS = VerifierKind(
    lambda texts, c: _gate([f"final answer lacks {t!r}" for t in texts if t not in c.final_answer]),
    _texts("final_contains"),
    gate=True,
)
FINAL_EXCLUDES = VerifierKind(
    lambda texts, c: _gate([f"final answer contains {t!r}" for t in texts if t in c.final_answer]),
    _texts("final_excludes"),
    gate=True,
)
TOOLS_CALLED = VerifierKind(
    lambda names, c: _gate(
        [f"tool {n!r} was not called" for n in names if n not in {call.name for t in c.turns for call in t.calls}]
    ),
    _texts("tools_called"),
    gate=True,
)


def spec_problem(spec: Any) -> str | None:
    """Why a dataset entry's `verify` value cannot be used, or None."""
    if isinstance(spec, str):
        return None if spec.strip() else '"verify" must be a non-empty command'
    if not isinstance(spec, dict):
        return f'"verify" must be a command (string) or an object of checks, got {type(spec).__name__}'
    known = registry.VERIFIERS.names()
    unknown = sorted(set(spec) - set(known))
    if unknown:
        return f'"verify" has unknown check(s) {", ".join(map(repr, unknown))}; known: {", ".join(known)}'
    if not spec:
        return f'"verify" needs at least one of {", ".join(known)}'
    for name in known:
        if name in spec and (problem := registry.VERIFIERS[name].problem(spec[name])):
            return problem
    return None


async def verdict(name: str, value: Any, context: CheckContext) -> Verdict:
    """One check's verdict, whatever form its function answers in."""
    said = registry.VERIFIERS[name].check(value, context)
    if inspect.isawaitable(said):
        said = await said
    if isinstance(said, Verdict):
        return said
    if isinstance(said, bool):
        return Verdict(said, "", 1.0 if said else 0.0)
    if isinstance(said, (int, float)) and math.isfinite(said):
        return Verdict(said >= context.settings.threshold, "", float(said))
    raise TypeError(f"verifier kind {name!r} answered {type(said).__name__}, not a Verdict, bool or number")


async def check_object(spec: dict, context: CheckContext, started: float) -> dict:
    """The verification of an object of checks: its gates, then what measures."""
    names = [name for name in registry.VERIFIERS.names() if name in spec]
    gates = [name for name in names if registry.VERIFIERS[name].gate]
    failed = [found for name in gates if not (found := await verdict(name, spec[name], context)).passed]
    if failed:
        return result(False, 0.0, "\n".join(found.output for found in failed), started)
    measured = [(name, await verdict(name, spec[name], context)) for name in names if name not in gates]
    if not measured:
        return result(context.settings.threshold <= 1.0, 1.0, "every check holds", started)
    rewards = [(1.0 if found.passed else 0.0) if found.reward is None else found.reward for _, found in measured]
    if len(measured) == 1:
        found = measured[0][1]
        return result(found.passed, rewards[0], found.output, started, found.error)
    output = "\n".join(f"[{name}] {found.output}" for name, found in measured)
    error = "; ".join(f"{name}: {found.error}" for name, found in measured if found.error)
    return result(all(found.passed for _, found in measured), min(rewards), output, started, error)
