"""What the driver learns from worker events: the checkpoint, errors.jsonl and this run's counts."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from datetime import UTC, datetime

from trajforge.events import (
    PromptDone,
    PromptEnded,
    PromptError,
    PromptFailed,
    PromptStopped,
    RunRefused,
    SampleSkipped,
    StopReason,
)
from trajforge.failures import failure_class
from trajforge.runfolder.folder import RunFolder, write_json_atomic


class RunState:
    def __init__(
        self,
        folder: RunFolder,
        run_name: str,
        dataset_file: str,
        entries: dict[int, dict],
        done: list[int],
        started: float | None = None,  # time.monotonic() at this invocation's start; None: now
        copies: dict[int, int] | None = None,  # prompt index -> its copy number (samples.Plan.copies)
    ):
        self.folder = folder
        self.run_name = run_name
        self.dataset_file = dataset_file
        self.entries = entries  # prompt_index -> dataset entry
        self.copies = copies or {}
        self.completed = set(done)
        self.failed: set[int] = set()
        checkpoint = folder.load_checkpoint()
        self.batch_stats: dict = checkpoint.get("batch_stats", {})
        self.started = time.monotonic() if started is None else started
        self.ended: float | None = None  # set by settle(): the clock the checkpoint and statistics.json share
        earlier = checkpoint.get("duration_seconds")  # the earlier invocations' (absent before it was kept)
        plausible = isinstance(earlier, (int, float)) and not isinstance(earlier, bool) and 0 <= earlier < math.inf
        self.earlier = float(earlier) if plausible and isinstance(earlier, (int, float)) else 0.0
        self.stopped: str | None = None
        self.halted: StopReason | None = None  # no more model calls, and why
        self.halt_message = ""
        self.saved_at = 0.0
        self.dirty = True

    def record(self, event: PromptEnded | SampleSkipped) -> None:
        """One sample ended: its outcome counts in its batch's stats; a failure also gets a line in
        errors.jsonl, and a refusal stops the run. Until settle(), an entry counts as completed from
        its first finished sample."""
        self.dirty = True
        if isinstance(event, SampleSkipped):
            return
        stats = self.batch_stats.setdefault(str(event.batch_num), {}) if event.batch_num is not None else {}
        match event:
            case PromptDone(outcome=outcome, retries=retries):
                self.completed.add(event.index)
                stats[outcome] = stats.get(outcome, 0) + 1
                stats["retries"] = stats.get("retries", 0) + retries
                return
            case RunRefused(reason=reason):
                self.stopped = reason
                error = PromptError("api_refused", reason, 1)
            case PromptFailed(error=error):
                pass
        self.failed.add(event.index)
        stats["failed"] = stats.get("failed", 0) + 1
        stats["retries"] = stats.get("retries", 0) + error.attempts - 1
        self._error_line(event, error)

    def stop(self, event: PromptStopped) -> None:
        """A sample stopped before its end because the run may make no more model calls: pending, not
        failed, not a try; its errors.jsonl line says why (class budget)."""
        self.dirty = True
        self._error_line(event, PromptError(event.reason, event.message or event.reason, 0))

    def _error_line(self, event: PromptEnded | PromptStopped, error: PromptError) -> None:
        self.folder.append_error(
            {
                "prompt_index": event.index,
                "sample_index": event.sample,
                "copy": self.copies.get(event.index, 0),
                "batch_num": event.batch_num,
                **asdict(error),
                "error_class": failure_class(error.error_type),
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
                "source": self.entries[event.index],  # what --resume matches on
            }
        )

    def halt(self, reason: StopReason, message: str = "") -> None:
        """The run makes no more model calls; the first reason and the first message that says why stay."""
        self.halted = self.halted or reason
        self.halt_message = self.halt_message or message

    @property
    def retries(self) -> int:
        """Model-call retries of the prompts that ended, in every invocation on this folder
        (batch_stats carry over in the checkpoint); for a failed prompt, those of the call that failed."""
        return sum(stats.get("retries", 0) for stats in self.batch_stats.values())

    @property
    def duration_seconds(self) -> float:
        """Wall time of every invocation on this folder, this one so far included (each one's is saved
        with the checkpoint, so a kill -9 loses only the time since a prompt last ended)."""
        return round(self.earlier + (self.ended or time.monotonic()) - self.started, 3)

    def settle(self, done: list[int], failed: list[int]) -> None:
        """The final word, from the batch files and errors.jsonl rather than from events that a kill
        or Ctrl-C may have cut short. The invocation's time ends here, as the checkpoint saves it: the
        statistics say the same, so a resume's total never comes out below the one before."""
        self.ended = time.monotonic()
        self.completed, self.failed = set(done), set(failed)
        self.save()

    def save_every(self, seconds: float) -> None:
        if self.dirty and time.monotonic() - self.saved_at >= seconds:
            self.save()

    def save(self) -> None:
        write_json_atomic(
            self.folder.checkpoint,
            {
                "run_name": self.run_name,
                "dataset_file": self.dataset_file,
                "completed_prompts": sorted(self.completed),
                "failed_prompts": sorted(self.failed),
                "batch_stats": self.batch_stats,
                "duration_seconds": self.duration_seconds,
                "last_updated": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
        self.saved_at, self.dirty = time.monotonic(), False
