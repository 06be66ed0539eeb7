"""What the driver learns from worker events: the checkpoint, errors.jsonl and this run's counts."""

from __future__ import annotations

import time
from datetime import UTC, datetime

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
        self.saved_at = 0.0
        self.dirty = True

    def record(self, kind: str, index: int, batch_num: int | None, detail, extra) -> None:
        """One prompt ended: "done" (detail: its outcome), "failed" or "fatal" (detail: the error)."""
        self.ended += 1
        self.dirty = True
        stats = self.batch_stats.setdefault(str(batch_num), {}) if batch_num is not None else {}
        if kind == "done":
            self.completed.add(index)
            stats[detail] = stats.get(detail, 0) + 1
            stats["retries"] = stats.get("retries", 0) + extra[0]
            return
        if kind == "fatal":
            self.stopped = detail
            detail = {"error_type": "api_refused", "message": detail, "attempts": 1}
        self.failed.add(index)
        stats["failed"] = stats.get("failed", 0) + 1
        stats["retries"] = stats.get("retries", 0) + detail["attempts"] - 1
        self.folder.append_error(
            {
                "prompt_index": index,
                "batch_num": batch_num,
                **detail,
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
                "source": self.entries[index],  # what --resume matches on
            }
        )

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
