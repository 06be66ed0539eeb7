"""A verification's result: always the same dict, `{verified, passed, reward, output,
duration_seconds, error}` (checks.py says why), and the settings every check reads."""

from __future__ import annotations

import time
from dataclasses import dataclass

from trajforge.flags import default

OUTPUT_CAP = 2000  # characters of a verifier's output kept in the record
KEYS = ("verified", "passed", "reward", "output", "duration_seconds", "error", "replay_diverged")


@dataclass(frozen=True)
class VerifySettings:
    timeout: float = default("verify_timeout")  # seconds for one sample's whole verification
    threshold: float = default("pass_threshold")  # reward a sample needs to pass
    verifier: str | None = None  # "/abs/path/file.py:function" or "module:function"; wins over `verify`
    reward_range: tuple[float, float] = (0.0, 1.0)  # a reward outside it is a verification error
    judge: str | dict | None = None  # --judge: every entry's `judge` check (a rubric, or its object)
    judge_samples: int = default("judge_samples")  # verdicts asked per sample, their mean the reward


def unverified() -> dict:
    return {
        "verified": False,
        "passed": False,
        "reward": 0.0,
        "output": "",
        "duration_seconds": 0.0,
        "error": "",
        "replay_diverged": False,  # --rescore: a replayed call gave another result (pipeline/replay.py)
    }


CUT = "\n[... output cut ...]"


def capped(text: str, tail: bool = False) -> str:
    """`text` within OUTPUT_CAP: its head (a verifier's output), or with `tail` its end (where a task
    check's verdict is), the cut marked."""
    if len(text) <= OUTPUT_CAP:
        return text
    keep = OUTPUT_CAP - len(CUT)
    return CUT.lstrip("\n") + "\n" + text[-keep + 1 :] if tail else text[:keep] + CUT


def result(passed: bool, reward: float, output: str, started: float, error: str = "") -> dict:
    return {
        "verified": True,
        "passed": passed,
        "reward": float(reward),
        "output": capped(output),
        "duration_seconds": round(time.monotonic() - started, 3),
        "error": error,
        "replay_diverged": False,
    }
