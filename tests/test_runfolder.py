"""The run folder in-process: entry keys, batch-file appends and torn lines, batch numbering, atomic
writes and the folder lock (trajforge.runfolder.folder)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from trajforge.errors import UsageError
from trajforge.runfolder.folder import BatchFiles, RunFolder, entry_key, write_atomic


def test_entry_key_is_the_prompt_and_where_it_runs():
    base = {"prompt": "Grüße", "cwd": "sub"}
    assert entry_key(base) == entry_key({"cwd": "sub", "prompt": "Grüße", "id": 7, "answer": "x"})
    for other in ({"image": "a:1"}, {"docker_image": "a:1"}, {"cwd": "elsewhere"}, {"prompt": "Grüße "}):
        assert entry_key(base | other) != entry_key(base), other
    assert "Grüße" in entry_key(base)  # readable in errors.jsonl and the plan, not \u-escaped


def test_concurrent_appends_land_as_whole_lines_and_close_with_the_last_prompt(tmp_path):
    folder = RunFolder(tmp_path)
    files = BatchFiles(folder)
    lines = [json.dumps({"n": n, "pad": "x" * (n * 997 % 5000)}).encode() + b"\n" for n in range(60)]
    files.start(3, len(lines))

    async def one(line: bytes) -> None:
        await files.append(3, line)
        files.finish(3)

    async def every() -> None:
        await asyncio.gather(*(one(line) for line in lines))

    asyncio.run(every())
    assert sorted(folder.batch_file(3).read_bytes().splitlines(keepends=True)) == sorted(lines)
    assert files.open == {} and files.remaining == {} and files.syncing == {}


def test_an_append_after_a_torn_line_starts_on_a_line_of_its_own(tmp_path):
    folder = RunFolder(tmp_path)
    folder.batch_file(0).write_bytes(b'{"n": 1}\n{"n": 2, "cut')  # a crash in the middle of a write
    files = BatchFiles(folder)
    files.start(0, 1)
    asyncio.run(files.append(0, b'{"n": 3}\n'))
    files.finish(0)
    warnings: list[str] = []
    records = [record for _, record in folder.batch_lines(warnings.append)]
    assert records == [{"n": 1}, {"n": 3}]
    assert warnings == ["batch_0.jsonl line 2 is incomplete (cut off by a crash?); ignoring it"]


def test_lines_in_skips_blank_and_torn_lines_and_ends_every_line(tmp_path):
    path = tmp_path / "batch_0.jsonl"
    path.write_bytes(b'{"a": 1}\n\n   \n{"b": 2}\n{"c": 3')
    warnings: list[str] = []
    assert list(RunFolder.lines_in(path, warnings.append)) == [(b'{"a": 1}\n', {"a": 1}), (b'{"b": 2}\n', {"b": 2})]
    assert warnings == ["batch_0.jsonl line 5 is incomplete (cut off by a crash?); ignoring it"]
    path.write_bytes(b'{"a": 1}\n{"whole": true}')  # the newline is all that is missing: the line counts
    assert [raw for raw, _ in RunFolder.lines_in(path, warnings.append)] == [b'{"a": 1}\n', b'{"whole": true}\n']
    assert list(RunFolder.lines_in(tmp_path / "missing.jsonl", warnings.append)) == []
    assert len(warnings) == 1


def test_batch_files_in_numeric_order_and_the_next_number(tmp_path):
    folder = RunFolder(tmp_path / "run")
    assert folder.batch_files() == [] and folder.next_batch_num() == 0  # the folder does not exist yet
    folder.path.mkdir()
    others = ("batch_x.jsonl", "batch_7.jsonl.bak", "xbatch_9.jsonl")
    for name in ("batch_2.jsonl", "batch_10.jsonl", "batch_0.jsonl", *others):
        (folder.path / name).write_text("")
    assert [num for num, _ in folder.batch_files()] == [0, 2, 10]
    assert folder.next_batch_num() == 11


def test_has_run_sees_any_trace_of_an_earlier_run(tmp_path):
    folder = RunFolder(tmp_path)
    assert not folder.has_run()
    for path in (folder.batch_file(0), folder.checkpoint, folder.errors):
        path.write_text("")
        assert folder.has_run(), path.name
        path.unlink()


def test_write_atomic_replaces_the_file_or_leaves_it_as_it_was(tmp_path):
    target = tmp_path / "statistics.json"
    target.write_text("old")
    write_atomic(target, lambda handle: handle.write(b"new"))
    assert target.read_text() == "new"

    def fails(handle) -> None:
        handle.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, fails)
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["statistics.json"]  # no temporary file left


def test_remove_leftovers_removes_only_temporary_files_of_atomic_writes(tmp_path):
    folder = RunFolder(tmp_path)
    names = [".trajectories.jsonl.ab12", ".statistics.json.cd34", ".checkpoint.json.ef56", "batch_0.jsonl", ".lock"]
    for name in names:
        (tmp_path / name).write_text("x")
    folder.remove_leftovers()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "batch_0.jsonl"]


HOLD_LOCK = """
import sys
from pathlib import Path
from trajforge.runfolder.folder import RunFolder
with RunFolder(Path(sys.argv[1])).locked():
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_the_lock_refuses_a_second_run_until_the_first_process_is_gone(tmp_path):
    folder = RunFolder(tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(UsageError, match="is in use by another run that is still going"), folder.locked():
            pass
    finally:
        holder.kill()  # however the holder ends, even by SIGKILL, the lock goes with it
        holder.wait()
    # flock is per open file: a second one in this process is refused too
    with folder.locked(), pytest.raises(UsageError), folder.locked():
        pass
    with folder.locked():  # released when the run ends, so a later run in the same process can take it
        pass
