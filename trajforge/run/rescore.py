"""--rescore: every finished sample of a run verified again, as the dataset's `verify`, `tests` and
`reference`, --verifier and --judge say now, without a call to the agent's model.

Each sample goes through the runs' own sample pipeline (pipeline/sample.py) with its recorded session in
the agent's place (pipeline/replay.py): a fresh environment of the run's backend, the task in place,
the recorded calls that change the environment replayed when the verification needs the workspace
(not for a judge or the answer's gates alone), then the clean room and the verification as after a
run. A sample is matched to the dataset's entry by its key without `tests` (task_key), and takes that
entry (its `verify`, `tests`, `reference` now). The new verifications go into the run's next
rescore_N.jsonl (journal/rescored.py), never into the batch files; the merge then reads each sample
with its newest one. A sample's usage becomes what it cost with this re-scoring's judge calls added.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from trajectory import record_usage
from trajforge.agent.loop import AgentResult
from trajforge.caller import Caller
from trajforge.environments import backend_for
from trajforge.environments.folder_task import KEY
from trajforge.journal import read as read_sample
from trajforge.journal import rescored
from trajforge.journal.sample import Sample
from trajforge.model.usage import add_usage, empty_usage
from trajforge.money.errors import SpendStop
from trajforge.money.spending import Spending, sample_scope
from trajforge.pipeline.replay import Replay
from trajforge.pipeline.sample import Acted, SamplePipeline
from trajforge.run.dataset import Entry
from trajforge.runconfig import RunConfig
from trajforge.runfolder.folder import RunFolder, entry_key, write_atomic
from trajforge.tools.services import ToolServices
from trajforge.tools.toolsets import every_tool
from trajforge.verification.host_folders import HostFolders
from trajforge.verification.result import VerifySettings

# Checks that read only the conversation: a sample verified by these alone needs no replay.
READS_THE_CONVERSATION = frozenset({"judge", "final_contains", "final_excludes", "tools_called"})


@dataclass(frozen=True)
class Rescored:
    samples: int  # verified again
    diverged: int  # of which a replayed call gave another result
    failed: int  # could not be verified again: they keep their previous verification
    file: str  # the re-scoring's journal file


def task_key(entry: dict) -> str:
    """What matches a finished sample to the dataset's entry now: its key without the hidden tests, which a
    re-scoring may add or change (the sample's entry becomes the dataset's, tests and all)."""
    return entry_key({name: value for name, value in entry.items() if name != "tests"})


def needs_workspace(entry: dict, settings: VerifySettings) -> bool:
    """Whether the verification reads the environment (a command, hidden tests, a Python verifier, a task
    folder, a plugin's check): then the sample's workspace is rebuilt by replaying its calls."""
    if settings.verifier or "tests" in entry or KEY in entry:
        return True
    spec = entry.get("verify")
    if isinstance(spec, str):
        return True
    return bool(set(spec or {}) - READS_THE_CONVERSATION)


def with_spent(stored: dict, spent: dict) -> dict:
    """A sample's usage as the record keeps it, with what its re-scoring spent added."""
    known = stored.get("cost_known", True)
    total = empty_usage()
    add_usage(total, {**stored, "cost": stored["cost"] if known else None})
    add_usage(total, spent)
    return record_usage(total)


@dataclass(frozen=True)
class RescoreRecorder:
    """The sample's new verification (with what its replay said) and usage."""

    sample: Sample
    replay: Replay

    def view(self, result: AgentResult, seconds: float) -> dict:
        return self.sample.record()

    def finish(self, acted: Acted) -> tuple[dict, dict]:
        verification = dict(acted.verification)
        said = self.replay.said()
        if said:
            verification["output"] = said + verification["output"]
        verification["replay_diverged"] = bool(self.replay.diverged)
        return verification, with_spent(self.sample.usage, acted.result.usage)


async def rescore_all(
    config: RunConfig, folder: RunFolder, entries: list[Entry], copies: dict[int, int], warn: Callable[[str], None]
) -> Rescored:
    """Verify every finished sample of `folder` again; its lines into the next rescore_N.jsonl."""
    now = {task_key(entry.data): entry.data for entry in entries}  # the dataset as it is now
    spending = Spending(config.money, config.secrets.redact)
    judge = config.judge.settings(config.model)
    services = ToolServices(config.tools, config.model, config.secrets, spending, judge)
    folders = HostFolders.of(config.dataset_file, config.task_root or ())
    pipeline = SamplePipeline(
        backend_for(config.environment), config.verify, folders, config.setup_timeout, config.secrets, services
    )
    tools = every_tool()
    slots = asyncio.Semaphore(config.num_workers * config.concurrency)
    number = (rescored.files(folder.path)[-1][0] + 1) if rescored.files(folder.path) else 1
    lines: list[bytes] = []
    failed = diverged = 0

    async def one(where: rescored.Where, sample: Sample) -> None:
        nonlocal failed, diverged
        key = entry_key(sample.entry)
        entry = now.get(task_key(sample.entry), sample.entry)
        replay = Replay(sample, tools, needs_workspace(entry, config.verify))
        caller = Caller(sample_scope(key, copies.get(sample.prompt_index, 0), sample.sample_index))
        async with slots:
            try:
                done = await pipeline.run(entry, caller, replay, RescoreRecorder(sample, replay))
            except SpendStop:
                raise
            except Exception as exc:
                failed += 1
                warn(f"--rescore: {where[0]} line {where[1]} keeps its verification: {type(exc).__name__}: {exc}")
                return
        verification, usage = done.record
        diverged += verification["replay_diverged"]
        lines.append(rescored.line(where, sample, entry, verification, usage, number))

    samples = [(where, read_sample(record, line)) for where, line, record in folder.located_lines(warn)]
    try:
        await asyncio.gather(*(one(where, sample) for where, sample in samples))
    except SpendStop as exc:
        warn(f"--rescore stopped by the budget ({exc}): the samples not verified again keep their verification")
    finally:
        await services.close()
        await spending.close()
    path = folder.path / f"rescore_{number}.jsonl"
    if lines:
        write_atomic(path, lambda handle: handle.writelines(sorted(lines)))
    return Rescored(len(lines), diverged, failed, path.name)
