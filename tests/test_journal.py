"""The journal (trajforge/journal): a run folder written by main before it (tests/fixtures/v1_run, made by
its make.sh with main at 38ca73a) re-merges to the bytes that main wrote, every export included; the same
samples journalled as version-2 lines render those bytes too; and an old folder resumed with more work
gets new lines beside its old ones."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from conftest import ROOT, run_cli

from trajectory import ToolCall, Turn, conversations
from trajforge import journal, safejson
from trajforge.journal import offered
from trajforge.journal.sample import VERSION
from trajforge.runfolder.folder import RunFolder

FIXTURE = ROOT / "tests" / "fixtures" / "v1_run"
EXPORTS = {"a": "openai,llamafactory,atif", "b": "openai,rl,parquet"}
RECOMPUTED = ("duration_seconds", "completed_at", "dataset_file")  # statistics.json: this invocation's own

# Fields added to every row since 38ca73a, at their zero values (docs/record.md): the only difference allowed.
ADDED = {"judge_tokens": 0, "judge_cost": 0.0, "replay_diverged": False}


def without_added(value):
    """`value` with the fields added since 38ca73a taken out, each of them checked to be at its zero value."""
    if isinstance(value, list):
        return [without_added(item) for item in value]
    if not isinstance(value, dict):
        return value
    for key in ADDED.keys() & value.keys():
        assert (value[key], type(value[key])) == (ADDED[key], type(ADDED[key])), (key, value[key])
    return {key: without_added(item) for key, item in value.items() if key not in ADDED}


def as_main_wrote(mine: bytes, name: Path) -> bytes:
    """A file this version wrote, without the added fields, in the bytes of json.dumps (key order kept)."""
    if name.suffix == ".jsonl":
        return b"".join(json.dumps(without_added(json.loads(line))).encode() + b"\n" for line in mine.splitlines())
    return json.dumps(without_added(json.loads(mine))).encode()


def same_as_main(mine: bytes, theirs: bytes, name: Path) -> bool:
    """Byte for byte, or (where this version adds fields to every row) equal once they are taken out."""
    if mine == theirs or name.suffix not in (".jsonl", ".json", ".parquet"):
        return mine == theirs
    if name.suffix == ".parquet":  # the same rows (parquet's bytes hold the schema, which the added fields change)
        return parquet_rows(mine) == parquet_rows(theirs)
    return as_main_wrote(mine, name) == as_main_wrote(theirs, name)


def parquet_rows(data: bytes) -> list:
    import pyarrow.parquet

    return without_added(pyarrow.parquet.read_table(io.BytesIO(data)).to_pylist())


def report_digest(page: Path) -> str:
    """report_digest.digest (the fixture's own normaliser, which make.sh used) of the embedded samples without
    the added fields."""
    text = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', text, re.S).group(1))
    return hashlib.sha256(json.dumps(without_added(data["trajectories"]), sort_keys=True).encode()).hexdigest()


def resume(output: Path, run: str, *flags: str) -> tuple[int, str]:
    code, out, err = run_cli(
        [
            f"--dataset_file={FIXTURE / run / 'prompts.jsonl'}",
            f"--run_name={run}",
            f"--output_dir={output}",
            "--model=mock",
            "--resume",
            f"--export={EXPORTS[run]}",
            *flags,
        ]
    )
    return code, out + err


def card_lines(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "(git " not in line and " s of running" not in line]


def expected_files(run: str) -> list[Path]:
    there = FIXTURE / "expected" / run
    return sorted(p.relative_to(there) for p in there.rglob("*") if p.is_file() and p.suffix != ".sha256")


def assert_written_as_main_did(folder: Path, run: str) -> None:
    there = FIXTURE / "expected" / run
    for name in expected_files(run):
        mine, theirs = (folder / name).read_bytes(), (there / name).read_bytes()
        if name.name == "statistics.json":
            mine, theirs = (json.loads(text) for text in (mine, theirs))
            for key in RECOMPUTED:
                assert key in mine and key in theirs
                mine.pop(key), theirs.pop(key)
            for key in set(mine) - set(theirs):  # added since 38ca73a (attempts, failure classes)
                mine.pop(key)
            mine = without_added(mine)
        elif name.name == "README.md":  # names the checkout's commit, the dataset's path and the run's seconds
            mine, theirs = (card_lines(text) for text in (mine, theirs))
        else:
            assert same_as_main(mine, theirs, name), f"{run}/{name} differs from what main wrote"
            continue
        assert mine == theirs, f"{run}/{name} differs from what main wrote"
    assert report_digest(folder / "report.html") == (there / "report.sha256").read_text().strip()


@pytest.fixture
def old_folders(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.endswith("API_KEY")]:
        monkeypatch.delenv(name)
    shutil.copytree(FIXTURE / "out", tmp_path / "out")
    return tmp_path / "out"


@pytest.mark.parametrize("run", ["a", "b"])
def test_an_old_run_folder_re_merges_to_the_bytes_main_wrote(old_folders, run):
    code, output = resume(old_folders, run)
    assert code == 0, output
    assert_written_as_main_did(old_folders / run, run)
    # Nothing was rewritten: the old lines stay as they are.
    for path in (FIXTURE / "out" / run).glob("batch_*.jsonl"):
        assert (old_folders / run / path.name).read_bytes() == path.read_bytes()


def journalled(folder: Path) -> int:
    """Each version-1 line of the folder's batch files rewritten as the version-2 line of the same sample."""
    lines = 0
    for _, path in RunFolder(folder).batch_files():
        out = []
        for line in path.read_bytes().splitlines(True):
            sample = journal.read(orjson.loads(line), line)
            out.append(replace(sample, legacy=None, legacy_line=None).journal())
        path.write_bytes(b"".join(out))
        lines += len(out)
    return lines


@pytest.mark.parametrize("run", ["a", "b"])
def test_the_same_samples_journalled_render_the_same_bytes(old_folders, run):
    assert journalled(old_folders / run) > 0
    first = orjson.loads(next((old_folders / run).glob("batch_*.jsonl")).read_bytes().splitlines()[0])
    assert first["version"] == VERSION and "conversations" not in first  # the sample, not its text
    code, output = resume(old_folders, run)
    assert code == 0, output
    assert_written_as_main_did(old_folders / run, run)


def test_a_line_of_a_newer_version_is_refused_by_name():
    with pytest.raises(ValueError, match="a batch line of version 3, newer than this batch-runner reads"):
        journal.read({"version": 3}, b"{}")


def test_an_old_folder_resumed_with_more_samples_keeps_its_lines_and_adds_new_ones(old_folders):
    code, output = resume(old_folders, "a", "--n_samples=3")
    assert code == 0, output
    folder = old_folders / "a"
    rows = (folder / "trajectories.jsonl").read_bytes().splitlines(True)
    before = (FIXTURE / "expected" / "a" / "trajectories.jsonl").read_bytes().splitlines(True)
    name = Path("trajectories.jsonl")
    assert same_as_main(b"".join(rows[: len(before)]), b"".join(before), name)  # the old lines first, as main wrote
    added = [json.loads(row) for row in rows[len(before) :]]
    assert {row["metadata"]["sample_index"] for row in added} == {2}
    old = json.loads(rows[0])
    for row in added:  # the same keys, nested ones included, so the file loads as one table
        assert list(row) == list(old) and list(row["metadata"]) == list(old["metadata"])
        for key in ("usage", "verification"):
            assert list(row["metadata"][key]) == list(old["metadata"][key])
        assert [list(turn) for turn in row["conversations"]][:2] == [list(turn) for turn in old["conversations"]][:2]
    new_lines = [orjson.loads(line) for line in (folder / "batch_3.jsonl").read_bytes().splitlines()]
    assert new_lines and all(line["version"] == VERSION for line in new_lines)
    stats = json.loads((folder / "statistics.json").read_text())
    assert stats["verification"]["verified_samples"] == 3


def test_a_calls_texts_are_json_dumps_whatever_they_hold():
    """The merge writes a call's texts around the encoded values (trajectory._CallTexts):
    the same text as json.dumps(..., ensure_ascii=False) of the whole dict, for hostile values too."""
    odd = 'q"uo\\te\n\t\x00\x1f\x7f é ☕ \u2028 \ud800 <tool_call>'
    calls = [
        ToolCall(odd, odd, json.dumps({"x": [1.5, 1e16, 2**70, odd]}), {"r": [odd, 1e-7, float("nan"), None]}),
        ToolCall("call_2", "terminal", "not json {", odd),
        ToolCall(7, None, {"sent": "not text"}, []),  # type: ignore[arg-type]  # what a hand-made line may hold
    ]

    def as_main_wrote(call: ToolCall) -> tuple[str, str, str]:
        def text(value):
            return json.dumps(value, ensure_ascii=False)

        try:  # as the record has held them: parsed when JSON the run's limits take (safejson.py)
            arguments = safejson.parse(call.arguments)
        except (TypeError, ValueError):
            arguments = call.arguments
        return (
            text([{"id": call.id, "name": call.name, "arguments": call.arguments}]),
            text({"name": call.name, "arguments": arguments}),
            text({"tool_call_id": call.id, "name": call.name, "content": call.result}),
        )

    for call in calls:
        gpt, tool = conversations("system", "prompt", [Turn("answer", "why", [call])])[2:]
        listed, body, response = as_main_wrote(call)
        assert gpt["tool_calls"] == listed
        assert gpt["value"] == f"<think>\nwhy\n</think>\nanswer\n<tool_call>\n{body}\n</tool_call>"
        assert tool["value"] == f"<tool_response>\n{response}\n</tool_response>"


def test_a_tool_list_met_again_is_not_parsed_again_and_the_line_reads_the_same():
    """journal.loads (journal/offered.py) shares the offered tools of lines that offer the same list, and
    reads every line as orjson.loads does: a nested "tools" of the entry with the same bytes is parsed
    whole, and a torn line or one with nothing before the list is refused as orjson.loads refuses it."""
    line = next((FIXTURE / "out" / "a").glob("batch_*.jsonl")).read_bytes().splitlines(True)[0]
    sample = replace(journal.read(orjson.loads(line), line), legacy=None, legacy_line=None)
    honest = [replace(sample, prompt_index=index).journal() for index in range(3)]
    nested = replace(sample, entry={"prompt": "p", "meta": {"a": 1, "tools": sample.tools, "toolsets": []}})
    lines = [*honest, nested.journal()]
    records = [journal.loads(line) for line in lines]
    for line, record in zip(lines, records, strict=True):
        assert record == orjson.loads(line) and list(record) == list(orjson.loads(line))
    assert records[1]["tools"] is records[0]["tools"] and records[2]["tools"] is records[0]["tools"]
    assert journal.read(records[2], lines[2]).system == sample.system
    for broken in (honest[1][:-200], b"{" + honest[1][honest[1].index(b',"tools":') :]):
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(broken)
        with pytest.raises(orjson.JSONDecodeError):
            journal.loads(broken)


def test_what_the_merge_keeps_of_tool_lists_is_bounded_whatever_lists_the_lines_offer():
    """A hostile MCP server may list a different 16 MB of tools to every sample: the lists and system texts
    journal/offered.py keeps stay within its byte bound (the merge used to keep 64 of each), and each line
    still reads as orjson.loads reads it."""
    line = next((FIXTURE / "out" / "a").glob("batch_*.jsonl")).read_bytes().splitlines(True)[0]
    sample = replace(journal.read(orjson.loads(line), line), legacy=None, legacy_line=None)
    big = [{"name": f"t{i}", "description": "x" * (1 << 20), "parameters": {"type": "object"}} for i in range(5)]
    for index in range(12):
        tools = [{**tool, "name": f"{tool['name']}_{index}"} for tool in big]
        written = replace(sample, prompt_index=index, tools=tools).journal()
        record = journal.loads(written)
        assert record == orjson.loads(written)
        assert journal.read(record, written).system.count("x" * (1 << 20)) == len(big)
        assert sum(map(len, offered._lists)) <= offered.KEPT_BYTES
        assert sum(len(key) + len(text) for key, text in offered._texts.items()) <= offered.KEPT_BYTES
