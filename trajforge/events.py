"""What workers tell the driver, one frozen dataclass per kind.

Events cross a process boundary (a multiprocessing queue, or Ray's object store), so they hold only
plain values that pickle. The driver matches on the type: `match event: case PromptDone(): ...`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Why a run makes no more model calls: --max_cost, a cost limit without a cost, --token_ids=required
# without ids (money/errors.py, model/tokens.py).
StopReason = Literal["budget", "cost_unknown", "no_token_ids"]


class OfSample:
    """An event about one sample: `unit` is what the driver tracks as outstanding."""

    index: int
    sample: int

    @property
    def unit(self) -> tuple[int, int]:
        return self.index, self.sample


@dataclass(frozen=True)
class Claimed:
    """A worker took a slice of a batch: if it dies, these samples are lost with it."""

    units: tuple[tuple[int, int], ...]  # (prompt_index, sample_index)
    pid: int


@dataclass(frozen=True)
class SampleStarted:
    """A worker that cannot write the run folder (Ray without a shared filesystem) starts a sample: the
    driver counts the try in attempts.jsonl (runfolder/attempts.py; `unit`: its unit_id)."""

    unit: str


@dataclass(frozen=True)
class PromptDone(OfSample):
    """A prompt has its line in its batch file. `outcome` is the exit reason (completed, max_turns, ...)
    or, for a discarded sample, the discard reason.

    `line` is set only where the driver writes the batch files (Ray without a shared filesystem): the
    line travels with the event and counts once the driver has it on disk."""

    index: int
    batch_num: int
    outcome: str
    retries: int  # model-call retries this prompt needed
    line: bytes | None = None
    sample: int = 0
    passed: bool | None = None  # its verification; None when nothing verified it
    tools_offered: int = 0  # for the driver's warning about a model that never calls a tool
    tool_calls: int = 0


@dataclass(frozen=True)
class Retrying:
    """A model call of this prompt failed and will be tried again (the driver shows it as it happens)."""

    index: int
    error_type: str  # as errors.jsonl would say it: api_http_500, api_connection_refused ...
    message: str


@dataclass(frozen=True)
class PromptError:
    """Why a prompt failed, as errors.jsonl records it."""

    error_type: str  # api_<kind> (api_connection_refused ...), context_length, environment, crash_<exception>,
    # worker_died, api_refused
    message: str
    attempts: int  # model calls tried, for an API error; 1 otherwise


@dataclass(frozen=True)
class PromptFailed(OfSample):
    """A prompt ended without a line; `--resume` runs it again. `batch_num` is None when the driver
    reports it for a worker that died."""

    index: int
    batch_num: int | None
    error: PromptError
    sample: int = 0


@dataclass(frozen=True)
class RunRefused(OfSample):
    """The endpoint refused the key or account (401/402/403) on this prompt: the run stops."""

    index: int
    batch_num: int
    reason: str
    sample: int = 0


@dataclass(frozen=True)
class SampleSkipped(OfSample):
    """A sample not started because its entry already had --stop_after_passes passes: no line."""

    index: int
    batch_num: int
    sample: int


@dataclass(frozen=True)
class PromptStopped(OfSample):
    """A prompt stopped before its next model call because the run may make no more (`reason`:
    "budget" for --max_cost, "cost_unknown" when a cost limit meets a reply without a cost). Not
    finished and not failed: no line anywhere, and `--resume` runs it again."""

    index: int
    batch_num: int
    reason: StopReason
    message: str = ""
    sample: int = 0


@dataclass(frozen=True)
class DiskLow:
    """A worker starts no new sample: the run folder's disk has less than --min_free_disk_mb free."""

    folder: str
    needed_mb: int


@dataclass(frozen=True)
class Warned:
    """A warning of a worker's for the run to print once (a kept workspace left partly out: disk.py)."""

    text: str


@dataclass(frozen=True)
class LogLine:
    """A --verbose line to print as is."""

    text: str


PromptEnded = PromptDone | PromptFailed | RunRefused
Event = Claimed | SampleStarted | PromptEnded | Retrying | SampleSkipped | PromptStopped | LogLine | DiskLow | Warned
