"""Verification of a task folder's sample as Harbor does it, in our clean room.

After the agent's last turn its container stops, and a FRESH container of the task's image gets only
the agent's work folder (the image's WORKDIR), filtered on the host: no link that leaves it, no FIFO or
device (environments/carried.py); the output names what was dropped. There tests/ becomes /tests,
/logs/verifier is made empty, and `bash /tests/test.sh` runs with [verifier] env within the verifier's
timeout. The reward is /logs/verifier/reward.txt (one number), else reward.json (its `reward`, else the
mean of its numbers).

Why a fresh container: the agent had the first one, often as root, so it could replace a program test.sh
calls, plant a sitecustomize.py or an /etc/ld.so.preload. None of that is in the new container; only
what the agent left in its work folder is (docs/tasks.md says what that still allows).
"""

from __future__ import annotations

import asyncio
import json
import math
import shlex

from trajforge.environments import Environment
from trajforge.environments.folder_task import KEY, FolderSettings
from trajforge.verification.host_folders import task_files
from trajforge.verification.result import CUT, OUTPUT_CAP, VerifySettings, result

LOGS = "/logs/verifier"


def reward_of(text: str, name: str) -> tuple[float, dict]:
    """(reward, every named number) of reward.txt or reward.json; ValueError saying what is wrong."""
    if name == "reward.txt":
        value = float(text.strip())
        named = {"reward": value}
    else:
        named = json.loads(text)
        if not isinstance(named, dict) or not named:
            raise ValueError("reward.json must be an object of named numbers")
        for key, number in named.items():
            if isinstance(number, bool) or not isinstance(number, int | float):
                raise ValueError(f"reward.json: {key!r} is not a number")
        value = float(named["reward"]) if "reward" in named else sum(named.values()) / len(named)
    if not all(math.isfinite(float(number)) for number in [value, *named.values()]):
        raise ValueError(f"{name} holds a number that is not finite")
    return value, named


async def read_reward(env: Environment) -> tuple[float, dict]:
    """The reward the tests wrote: (reward, named numbers); FileNotFoundError when there is none."""
    for name in ("reward.txt", "reward.json"):
        try:
            text = await env.read_file(f"{LOGS}/{name}")
        except FileNotFoundError:
            continue
        return reward_of(text, name)
    raise FileNotFoundError(f"test.sh wrote no {LOGS}/reward.txt nor reward.json")


async def verify_folder(settings: VerifySettings, entry: dict, env: Environment, started: float) -> dict:
    """The verification of a task folder's sample; `env` is the agent's container, still open."""
    folder = FolderSettings.of(entry)
    assert folder is not None
    fresh = await env.fresh_copy()  # the agent's container stops before its work folder is copied
    try:
        removed = await fresh.remove_escapes()
        await fresh.put_folder("/tests", await asyncio.to_thread(task_files, entry[KEY]["folder"], "tests"))
        await fresh.put_folder(LOGS, {})
        variables = [f"{name}={value}" for name, value in folder.verifier_env.items()]
        command = shlex.join(["env", *variables, "bash", "/tests/test.sh"])
        done = await fresh.exec(command, folder.verify_timeout, capped=False)
        said = removed + done.output[-OUTPUT_CAP:]  # test.sh's last lines say why (pytest's summary)
        if done.timed_out:
            timed_out = f"test.sh timed out after {folder.verify_timeout:g}s"
            return result(False, 0.0, tail(said, OUTPUT_CAP), started, timed_out)
        try:
            reward, named = await read_reward(fresh)
        except (FileNotFoundError, ValueError) as exc:
            error = f"{exc} (test.sh exited {done.exit_code})"
            return result(False, 0.0, tail(said, OUTPUT_CAP), started, error)
    finally:
        await fresh.close()
    # The output's first line: every number of the reward file, as JSON text; then test.sh's last lines.
    line = json.dumps(named)
    return result(reward >= settings.threshold, reward, line + "\n" + tail(said, OUTPUT_CAP - len(line) - 1), started)


def tail(text: str, room: int) -> str:
    """The end of `text` in `room` characters, the cut marked at its start."""
    return text if len(text) <= room else CUT.lstrip("\n") + "\n" + text[-(room - len(CUT)) :]
