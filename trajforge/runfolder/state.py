"""What the driver learns from worker events: the checkpoint, errors.jsonl and this run's counts."""

from __future__ import annotations

import time
from dataclasses import asdict
from datetime import UTC, datetime

from trajforge.events import PromptDone, PromptEnded, PromptError, PromptFailed, RunRefused
from trajforge.runfolder.folder import RunFolder, write_json_atomic


class RunState:
    def __init__(self, folder: RunFolder, run_name: str, dataset_file: str, entries: dict[int, dict], done: list[int]):
        self.folder = folder
        self.run_name = run_name
        self.dataset_file = dataset_file
        self.entries = entries  # prompt_index -> dataset entry
        self.completed = set(done)
        self.failed: set[int] = set()
        self.batch_stats: dict = folder.load_checkpoint().get("batch_stats", {})
        self.ended = 0
        self.stopped: str | None = None
        self.halted: str | None = None  # no more model calls: "budget" or "cost_unknown" (money/errors.py)
        self.halt_message = ""
        self.saved_at = 0.0
        self.dirty = True

    def record(self, event: PromptEnded) -> None:
        """One prompt ended: its outcome counts in its batch's stats; a failure also gets a line in
        errors.jsonl, and a refusal stops the run."""
        self.ended += 1
        self.dirty = True
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
        self.folder.append_error(
            {
                "prompt_index": event.index,
                "batch_num": event.batch_num,
                **asdict(error),
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
                "source": self.entries[event.index],  # what --resume matches on
            }
        )

    def halt(self, reason: str, message: str = "") -> None:
        """The run makes no more model calls; the first reason and the first message that says why stay."""
        self.halted = self.halted or reason
        self.halt_message = self.halt_message or message

    @property
    def retries(self) -> int:
        """Model-call retries of the prompts that ended, in every invocation on this folder
        (batch_stats carry over in the checkpoint); for a failed prompt, those of the call that failed."""
        return sum(stats.get("retries", 0) for stats in self.batch_stats.values())

    def settle(self, done: list[int], failed: list[int]) -> None:
        """The final word, from the batch files and errors.jsonl rather than from events that a kill
        or Ctrl-C may have cut short."""
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
                "last_updated": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
        self.saved_at, self.dirty = time.monotonic(), False
