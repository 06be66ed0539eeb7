"""--check_tasks: are the tasks sound, before any money is spent? No model is called.

Every entry is tried twice, each time in a fresh environment of the run's backend and through the same
sample pipeline as a run's samples (pipeline/sample.py), with the oracle or nothing in the agent's place:
setup -> solution -> tests -> verify must pass (the oracle), and setup -> tests -> verify must fail (an
agent that does nothing). One line per entry goes to task_check.jsonl in the run folder; the tasks that
are not sound are printed as a table. Entries run at once up to --num_workers x --concurrency, on one event loop (the
commands are processes or containers of their own, so that is parallel where it matters).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trajforge.agent.loop import AgentResult
from trajforge.caller import Caller
from trajforge.environments import backend_for, liveness, prepare_run, remove_leftovers
from trajforge.environments.folder_task import KEY, FolderSettings
from trajforge.errors import SetupError, SetupFailed
from trajforge.pipeline.actors import Oracle, idle
from trajforge.pipeline.sample import Acted, SamplePipeline
from trajforge.run.dataset import Entry
from trajforge.run.task_folders import environment_for, load_entries
from trajforge.run.task_images import build_images
from trajforge.runconfig import RunConfig
from trajforge.runfolder.folder import RunFolder, write_atomic
from trajforge.verification.host_folders import HostFolders
from trajforge.verification.result import capped

FILE = "task_check.jsonl"


@dataclass(frozen=True)
class TaskCheck:
    index: int
    oracle_passed: bool
    noop_passed: bool
    ok: bool
    outputs: dict  # {"oracle": text, "noop": text}: what the setup, solution and verification said


def checked_entry(entry: dict) -> dict:
    """The entry as the check verifies it: an object spec keeps only its command (without a model there
    is no final answer and no tool call to look at, and no judge is called)."""
    spec = entry.get("verify")
    if isinstance(spec, dict):
        rest = {key: value for key, value in entry.items() if key != "verify"}
        return {**rest, "verify": spec["command"]} if "command" in spec else rest
    return entry


@dataclass(frozen=True)
class CheckRecorder:
    """A check's record: whether the try passed, and what its steps said (the oracle's solution, the verify)."""

    index: int
    data: dict
    oracle: Oracle | None

    def view(self, result: AgentResult, seconds: float) -> dict:
        return {"prompt_index": self.index, "conversations": [], "metadata": {"source": json.dumps(self.data)}}

    def finish(self, acted: Acted) -> tuple[bool, str]:
        verification = acted.verification
        said = [*(self.oracle.said if self.oracle else [])]
        said.append(f"verify: reward {verification['reward']}\n{verification['output']}")
        if verification["error"]:
            said.append(f"verify error: {verification['error']}")
        return bool(verification["passed"]), capped("\n".join(said), tail=True)  # the table shows the last line


async def attempt(pipeline: SamplePipeline, entry: Entry, oracle: bool, judged: bool = False) -> tuple[bool, str]:
    """(passed, what it said) for one try of a task, through the runs' own sample pipeline: with its
    solution (`oracle`) in place of the agent, or with nothing; `judged`: the run has a --judge, which
    the check leaves out."""
    data = checked_entry(entry.data)
    folder = FolderSettings.of(data)
    if folder and oracle and not (Path(data[KEY]["folder"]) / "solution" / "solve.sh").is_file():
        return False, "the task folder has no solution/solve.sh to check"
    if not folder and oracle and "solution" not in data:
        return False, "the entry has no `solution` to check"
    if not folder and pipeline.verify.verifier is None and "verify" not in data:
        if judged or "judge" in (entry.data.get("verify") or {}):
            return False, "only a judge verifies this entry, and --check_tasks calls no judge"
        return False, "nothing verifies this entry (no `verify` command and no --verifier)"
    actor = Oracle(folder.agent_timeout if folder else pipeline.setup_timeout) if oracle else None
    scope = f"check-{entry.index}-{'oracle' if oracle else 'noop'}"
    try:
        done = await pipeline.run(data, Caller(scope), actor or idle, CheckRecorder(entry.index, data, actor))
    except SetupError as exc:
        return False, f"environment: {exc}"
    except SetupFailed as exc:
        return False, capped(str(exc), tail=True)
    return done.record


async def check_all(config: RunConfig, entries: list[Entry]) -> list[TaskCheck]:
    folders = HostFolders.of(config.dataset_file, config.task_root or ())
    backend = backend_for(config.environment)
    judged = config.verify.judge is not None
    verify = replace(config.verify, judge=None)  # no model is called: no judge either
    pipeline = SamplePipeline(backend, verify, folders, config.setup_timeout, config.secrets)
    slots = asyncio.Semaphore(config.num_workers * config.concurrency)

    async def one(entry: Entry) -> TaskCheck:
        async with slots:
            (oracle, said), (noop, idle) = await asyncio.gather(
                attempt(pipeline, entry, True, judged), attempt(pipeline, entry, False, judged)
            )
        return TaskCheck(entry.index, oracle, noop, oracle and not noop, {"oracle": said, "noop": idle})

    return list(await asyncio.gather(*(one(entry) for entry in entries)))


def unsound_table(checks: list[TaskCheck], entries: list[Entry]) -> Table:
    prompts = {entry.index: entry.data["prompt"] for entry in entries}
    table = Table(title="Tasks that are not sound", title_justify="left")
    for column in ("index", "prompt", "oracle", "no-op", "why"):
        table.add_column(column)
    for check in checks:
        if check.ok:
            continue
        why = []
        if not check.oracle_passed:
            why.append("the oracle fails: " + check.outputs["oracle"].strip().splitlines()[-1][:80])
        if check.noop_passed:
            why.append("doing nothing passes")
        prompt = prompts[check.index].splitlines()[0][:50]
        oracle, noop = ("passed" if flag else "failed" for flag in (check.oracle_passed, check.noop_passed))
        table.add_row(str(check.index), escape(prompt), oracle, noop, escape("; ".join(why)))
    return table


def check_tasks(config: RunConfig, console: Console) -> int:
    """The whole --check_tasks invocation: 0 when every task is sound, 1 otherwise."""
    entries, notes = load_entries(config)
    environment, unsandboxed = environment_for(config.environment, entries)
    config = replace(config, environment=environment)
    for warning in (unsandboxed, *notes):
        if warning:
            console.print(f"[yellow]warning:[/] {escape(warning)}")
    folder = RunFolder(config.run_dir)
    with folder.locked():
        prepare_run(environment, False)
        build_images(
            (entry.data for entry in entries), environment.run_dir, console.print, environment.limits.max_processes
        )
        try:
            checks = asyncio.run(check_all(config, entries))
        finally:
            with contextlib.suppress(SetupError):
                remove_leftovers(environment)
                liveness.release(environment)  # once they went (prepare_run held it): no later start looks at it
        lines = b"".join(orjson.dumps(asdict(check)) + b"\n" for check in checks)
        write_atomic(folder.path / FILE, lambda handle: handle.write(lines))
    sound = sum(check.ok for check in checks)
    if sound < len(checks):
        console.print(unsound_table(checks, entries))
    console.print(f"{sound} of {len(checks)} tasks sound (no model was called); details in {folder.path / FILE}")
    code = 0 if sound == len(checks) else 1
    if config.summary_json:  # the console went to stderr
        unsound = [check.index for check in checks if not check.ok]
        summary = {"exit_status": code, "tasks": len(checks), "sound": sound, "unsound": unsound}
        print(json.dumps(summary | {"details": str(folder.path / FILE)}))
    return code
