"""The run folder `data/<run_name>/`: batch files, checkpoint, errors, atomic writes."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from trajectory import text_encoder, verification_passed
from trajforge import journal
from trajforge.errors import UsageError
from trajforge.failures import BUDGET, CLASSES, failure_class
from trajforge.journal import rescored

BATCH_FILE = re.compile(r"batch_(\d+)\.jsonl$")
FILE_MODE = 0o666  # every file of the run folder: the umask decides, as for any file the user makes


SORTED_TEXT = text_encoder(sort_keys=True)  # json.dumps(value, ensure_ascii=False, sort_keys=True)
TASK_KEYS = ("files", "workspace", "setup", "tests")  # what the agent finds, and what judges it (verification/tasks.py)


def entry_key(entry: dict) -> str:
    """What makes two dataset entries the same task: the prompt and where it runs, with what the task
    brings (only when it brings any, so keys of runs made before tasks stay the same)."""
    if isinstance(entry.get("harbor"), dict):  # a task folder (run/task_folders.py): its files but the hidden ones
        return json.dumps(["harbor", entry["harbor"].get("digest")])
    key = [entry.get("prompt"), entry.get("image"), entry.get("docker_image"), entry.get("cwd")]
    task = {name: entry[name] for name in TASK_KEYS if name in entry}
    return SORTED_TEXT([*key, task] if task else key)


def sample_key(record: dict) -> tuple[str, int]:
    """(entry key, sample index) of a batch line of any version: what --resume matches."""
    return entry_key(journal.entry_of(record)), journal.sample_index_of(record)


def passed(record: dict) -> bool | None:
    """Whether a batch line's verification passed; None when nothing verified it (or before verification)."""
    return verification_passed(journal.verification_of(record))


def open_temp(path: Path) -> tuple[int, Path]:
    """A new temporary file beside `path` for an atomic write, with the folder's file mode."""
    temp = path.parent / f".{path.name}.{secrets.token_hex(6)}"
    return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), temp


def write_atomic(path: Path, write: Callable) -> None:
    """Write through a temporary file in the same folder, fsync, then rename over `path`. The temporary
    file is made like any other file of the folder (tempfile's would be 0600 whatever the umask)."""
    fd, temp = open_temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)  # gone when an interrupt lands just after the rename
        raise


def write_json_atomic(path: Path, data: dict) -> None:
    write_atomic(path, lambda handle: handle.write(orjson.dumps(data, option=orjson.OPT_INDENT_2)))


@dataclass(frozen=True)
class RunFolder:
    path: Path

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint.json"

    @property
    def settings(self) -> Path:
        """run.json: the settings that shape the data, as the run's first invocation had them."""
        return self.path / "run.json"

    @property
    def statistics(self) -> Path:
        return self.path / "statistics.json"

    @property
    def trajectories(self) -> Path:
        return self.path / "trajectories.jsonl"

    @property
    def preferences(self) -> Path:
        return self.path / "preferences.jsonl"

    @property
    def tokens(self) -> Path:
        """tokens.jsonl (--token_ids): the token ids of each trajectory of trajectories.jsonl, line by line."""
        return self.path / "tokens.jsonl"

    @property
    def errors(self) -> Path:
        return self.path / "errors.jsonl"

    def batch_file(self, batch_num: int) -> Path:
        return self.path / f"batch_{batch_num}.jsonl"

    def batch_files(self) -> list[tuple[int, Path]]:
        """Every batch file, in batch order."""
        if not self.path.is_dir():
            return []
        found = ((BATCH_FILE.match(p.name), p) for p in self.path.iterdir())
        return sorted((int(m.group(1)), p) for m, p in found if m)

    def has_run(self) -> bool:
        return bool(self.batch_files()) or self.checkpoint.exists() or self.errors.exists()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder for this run; two runs appending to the same batch files would duplicate
        work and pay for it twice. Workers inherit the lock, and it goes with the process however it
        ends, so a killed run never leaves it taken."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UsageError(f"--run_name: {self.path} is in use by another run that is still going") from None
            yield
        finally:
            os.close(fd)

    def remove_leftovers(self) -> None:
        """Temporary files of an atomic write that a kill interrupted."""
        merged: tuple[str, ...] = ("trajectories.jsonl", "statistics.json", "checkpoint.json", "run.json")
        merged += ("preferences.jsonl", "tokens.jsonl")
        for name in (*merged, "README.md", "report.html"):
            for leftover in self.path.glob(f".{name}.*"):
                leftover.unlink(missing_ok=True)
        for leftover in self.path.glob("export/.*.*"):  # every file there is written atomically
            leftover.unlink(missing_ok=True)

    def next_batch_num(self) -> int:
        files = self.batch_files()
        return files[-1][0] + 1 if files else 0

    def batch_lines(self, warn: Callable[[str], None]) -> Iterator[tuple[bytes, dict]]:
        """(raw line, record) of every finished prompt, streaming, in batch order, each with its newest
        verification (journal/rescored.py)."""
        for _, line, record in self.located_lines(warn):
            yield line, record

    def located_lines(
        self, warn: Callable[[str], None], only: Iterable[rescored.Where] | None = None
    ) -> Iterator[tuple[rescored.Where, bytes, dict]]:
        """((batch file, line number), raw line, record) of every finished prompt, with its newest
        verification; with `only`, of those lines alone (no other is parsed, no file read past the last)."""
        newest = rescored.newest(self.path, warn)
        numbers = _numbers_by_file(only) if only is not None else None
        for _, path in self.batch_files():
            name, lines = path.name, self.raw_lines(path)
            if numbers is not None:
                if name not in numbers:
                    continue
                lines = _numbered(lines, numbers[name])
            for number, line, record in self.parsed(path, lines, warn):
                where = (name, number)
                if where in newest:
                    line, record = rescored.applied(record, newest[where])
                yield where, line, record

    @staticmethod
    def lines_in(path: Path, warn: Callable[[str], None]) -> Iterator[tuple[bytes, dict]]:
        """(raw line, record) of one batch file. A torn line (a write cut short by a crash) is
        skipped with a warning: that prompt simply runs again on --resume."""
        for _, line, record in RunFolder.parsed(path, RunFolder.raw_lines(path), warn):
            yield line, record

    @staticmethod
    def raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
        """(line number, line ending in a newline) of each non-blank line of one batch file, unparsed."""
        if not path.exists():
            return
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, 1):
                if not line.isspace():  # strip()'s test without its copy of the line
                    yield number, (line if line.endswith(b"\n") else line + b"\n")

    @staticmethod
    def parsed(
        path: Path, lines: Iterable[tuple[int, bytes]], warn: Callable[[str], None]
    ) -> Iterator[tuple[int, bytes, dict]]:
        """(line number, raw line, record) of `lines` of one batch file, as lines_in reads them."""
        for number, line in lines:
            try:
                record = journal.loads(line)
            except orjson.JSONDecodeError:
                warn(f"{path.name} line {number} is incomplete (cut off by a crash?); ignoring it")
                continue
            if isinstance(record, dict) and record.get("version", 1) > journal.VERSION:
                raise UsageError(
                    f"{path} line {number} is a journal of version {record['version']}, written by a newer"
                    f" batch-runner (this one reads up to {journal.VERSION}): upgrade to use this run folder"
                )
            yield number, line, record

    def load_settings(self) -> dict | None:
        """What run.json keeps, or None for a run folder without one (new, or made before it existed)."""
        try:
            settings = json.loads(self.settings.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise UsageError(f"--resume: {self.settings} cannot be read ({exc}); fix or remove it") from None
        if not isinstance(settings, dict):
            raise UsageError(f"--resume: {self.settings} must hold a JSON object of settings; fix or remove it")
        return settings

    def load_checkpoint(self) -> dict:
        try:
            return json.loads(self.checkpoint.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def error_lines(self) -> Iterator[dict]:
        """The lines of errors.jsonl (jsonlines loads only when a run has failures)."""
        if not self.errors.exists():
            return
        import jsonlines

        with jsonlines.open(self.errors) as reader:
            yield from reader.iter(type=dict, skip_invalid=True)

    def error_summary(self) -> tuple[dict[str, dict[str, int]], set[str]]:
        """({"types": failures per error type, "classes": per failure class}, entry keys of every prompt
        that ever failed) over errors.jsonl, read once. A budget stop is no failure: counted, not a key."""
        types: dict[str, int] = {}
        classes = dict.fromkeys(CLASSES, 0)
        keys: set[str] = set()
        for line in self.error_lines():
            kind = str(line.get("error_type", "unknown"))
            types[kind] = types.get(kind, 0) + 1
            group = str(line.get("error_class") or failure_class(kind))
            classes[group] = classes.get(group, 0) + 1
            if "source" in line and group != BUDGET:
                keys.add(entry_key(line["source"]))
        return {"types": types, "classes": classes}, keys

    def append_error(self, line: dict) -> None:
        import jsonlines

        with jsonlines.open(self.errors, mode="a", flush=True) as writer:
            writer.write(line)


class BatchFiles:
    """Appends whole lines to batch files, one descriptor per open batch.

    `append` returns once the line is on disk. Lines written while an fsync runs share the next one
    (group commit), so many sessions finishing at once cost one fsync, off the event loop, instead of
    one each on it; what survives `kill -9` is the same."""

    def __init__(self, folder: RunFolder):
        self.folder = folder
        self.open: dict[int, int] = {}
        self.remaining: dict[int, int] = {}
        self.next_sync: dict[int, asyncio.Future] = {}  # fd -> done when the lines written so far are synced
        self.syncing: dict[int, asyncio.Task] = {}

    def start(self, batch_num: int, size: int) -> None:
        """`size` more prompts of this batch will end here (a worker may take several slices of it)."""
        self.remaining[batch_num] = self.remaining.get(batch_num, 0) + size

    def write(self, batch_num: int, line: bytes) -> int:
        """Append one whole line; a write that fails half-way (disk full) is undone, so the next
        line never sticks to a torn one."""
        fd = self.open.get(batch_num)
        if fd is None:
            path = self.folder.batch_file(batch_num)
            fd = self.open[batch_num] = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash (Ray re-runs append here)
                os.write(fd, b"\n")
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            os.ftruncate(fd, start)
            raise
        return fd

    async def append(self, batch_num: int, line: bytes) -> None:
        fd = self.write(batch_num, line)
        waiter = self.next_sync.get(fd)
        if waiter is None:
            waiter = self.next_sync[fd] = asyncio.get_running_loop().create_future()
            if fd not in self.syncing:
                self.syncing[fd] = asyncio.create_task(self._sync(fd))
        await asyncio.shield(waiter)

    async def _sync(self, fd: int) -> None:
        try:
            while fd in self.next_sync:
                waiter = self.next_sync.pop(fd)
                try:
                    await asyncio.to_thread(os.fsync, fd)
                except OSError as exc:
                    waiter.set_exception(exc)
                else:
                    waiter.set_result(None)
        finally:
            del self.syncing[fd]

    def finish(self, batch_num: int) -> None:
        """One prompt of the batch ended; the file closes after the last one."""
        self.remaining[batch_num] -= 1
        if not self.remaining[batch_num]:
            del self.remaining[batch_num]
            fd = self.open.pop(batch_num, None)
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        for fd in self.open.values():
            os.close(fd)
        self.open.clear()


def _numbers_by_file(wanted: Iterable[rescored.Where]) -> dict[str, set[int]]:
    """The line numbers of `wanted`, by batch file."""
    numbers: dict[str, set[int]] = {}
    for name, number in wanted:
        numbers.setdefault(name, set()).add(number)
    return numbers


def _numbered(lines: Iterator[tuple[int, bytes]], numbers: set[int]) -> Iterator[tuple[int, bytes]]:
    """The `lines` whose numbers are among `numbers`, read no further than the last of them."""
    last = max(numbers)
    for number, line in lines:
        if number in numbers:
            yield number, line
        if number >= last:
            return
