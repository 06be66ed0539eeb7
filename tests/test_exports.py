"""--export and the dataset card (trajforge/export): the record parser in-process, then real runs against
the scripted server whose every export loads with HuggingFace `datasets`."""

from __future__ import annotations

import inspect
import json
import shutil
from collections import Counter

import pytest
from conftest import API_KEY, running_here, sample_of

from batch_runner import main
from trajectory import ToolCall, Turn
from trajforge.cli.config import build_config
from trajforge.export import llamafactory, loading
from trajforge.export.publish import Exports, publish
from trajforge.export.report import ReportData
from trajforge.journal import read, v1
from trajforge.journal.sample import Sample
from trajforge.journal.v1 import split_assistant
from trajforge.runfolder.folder import RunFolder
from trajforge.verification.result import unverified

TOOLS = ["--distribution=terminal_only"]
EVERY_FORMAT = "--export=openai,llamafactory,atif,parquet"
SCHEMAS = [{"type": "function", "function": {"name": n, "description": n, "parameters": {}}} for n in ("a", "b")]


def finished(turns: list[Turn], exit_reason: str = "completed") -> Sample:
    return sample_of(
        prompt_index=3,
        entry={"prompt": "do it\nsecond line"},
        turns=turns,
        tool_schemas=SCHEMAS,
        toolsets=["t"],
        tool_names=["a", "b"],
        exit_reason=exit_reason,
        usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "reasoning_tokens": 1, "cost": None},
        verification=unverified(),
    )


def record(turns: list[Turn], exit_reason: str = "completed") -> dict:
    """The ShareGPT record of the sample, as trajectories.jsonl has it."""
    return json.loads(finished(turns, exit_reason).trajectory_line())


def parse(record: dict) -> Sample:
    """A record read back by the reader of version-1 batch lines (the record and the batch file's keys)."""
    return v1.read(record, b"")


def parallel() -> list[Turn]:
    """Two calls in one turn (results answer by id), then an answer."""
    calls = [ToolCall("c1", "a", '{"x": 1}', {"out": "one"}), ToolCall("c2", "b", "{}", {"error": "bad"})]
    return [Turn("calling both", "think first", calls), Turn("done", "think again")]


def test_parse_matches_results_to_calls_by_id_and_splits_reasoning_from_content():
    conversation = parse(record(parallel()))
    assert conversation.prompt == "do it\nsecond line"
    assert [tool["name"] for tool in conversation.tools] == ["a", "b"]
    first, last = conversation.turns
    assert (first.reasoning, first.content, last.reasoning, last.content) == (
        "think first",
        "calling both",
        "think again",
        "done",
    )
    found = [(c.id, c.result, c.ok) for c in first.calls]
    assert found == [("c1", {"out": "one"}, True), ("c2", {"error": "bad"}, False)]


def test_parse_takes_the_uniform_turn_shape_and_records_without_optional_keys():
    shaped = record(parallel())
    for turn in shaped["conversations"]:  # every turn with the same keys, tool_calls as JSON text
        turn["finish_reason"] = (
            "tool_calls" if turn["tool_calls"] != "[]" else ("stop" if turn["from"] == "gpt" else "")
        )
    del shaped["metadata"]["usage"]
    conversation = parse(shaped)
    assert [step.finish_reason for step in conversation.turns] == ["tool_calls", "stop"]
    assert len(conversation.turns[0].calls) == 2 and conversation.turns[1].calls == []


@pytest.mark.parametrize(
    "content",
    ["plain", "", "quotes <tool_call>\n{} and \n<tool_call>\n in it", "a\n</think>\nstray tag", "<think>x</think>"],
)
def test_content_that_imitates_the_markup_comes_back_whole(content):
    calls = [ToolCall("c1", "a", '{"x": "\\n<tool_call>\\n"}', {})]
    value = next(t for t in record([Turn(content, "why", calls)])["conversations"] if t["from"] == "gpt")["value"]
    assert split_assistant(value, 1) == ("why", content.strip())


def test_llamafactory_positions_hold_with_parallel_calls_and_a_run_cut_after_a_tool_result():
    for turns, exit_reason in ((parallel(), "completed"), (parallel()[:1], "max_turns")):
        row = llamafactory.row(finished(turns, exit_reason))
        roles = [turn["from"] for turn in row["conversations"]]
        # LLaMA-Factory's rule, 1-based: human/observation at odd positions, gpt/function_call at even ones.
        assert all(role in ("human", "observation") for role in roles[0::2])
        assert all(role in ("gpt", "function_call") for role in roles[1::2])
        assert len(roles) % 2 == 0
        calls = json.loads(row["conversations"][1]["value"].split("</think>\n\n", 1)[1])
        assert [call["name"] for call in calls] == ["a", "b"] and calls[0]["arguments"] == {"x": 1}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, module_server):
    """A run whose trajectories hold parallel calls, broken arguments and a failing tool, plus two
    samples the merge drops; every format exported. Made once: its tests only read it (EXPORTED keeps
    them on one xdist worker)."""
    prompts = ["plain", "[mock calls=3]", "[mock bad_json]", "[mock reasoning=none]", "[mock unknown_tool]"]
    with running_here(tmp_path_factory.mktemp("exported"), module_server) as run_here:
        result = run_here([{"prompt": p} for p in prompts], *TOOLS, EVERY_FORMAT)
    assert result.code == 0, result.stdout + result.stderr
    return result


EXPORTED = pytest.mark.xdist_group("test_exports.exported")  # the tests of `exported`: it is made once


def load(path, tmp_path):
    """`datasets.load_dataset` as a user calls it, offline, its cache in the test's folder."""
    datasets = pytest.importorskip("datasets")
    builder = "parquet" if path.suffix == ".parquet" else "json"
    return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))


@EXPORTED
def test_every_export_loads_with_datasets_and_holds_the_trajectories(exported, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    kept = exported.trajectories
    assert len(kept) == 3  # reasoning=none and unknown_tool were dropped
    export = exported.run_dir / "export"
    for name in ("openai.jsonl", "llamafactory.json", "atif.jsonl", "trajectories.parquet"):
        assert len(load(export / name, tmp_path)) == len(kept), name
    parquet = load(export / "trajectories.parquet", tmp_path)
    assert [row["prompt_index"] for row in parquet] == [r["prompt_index"] for r in kept]
    assert parquet[0]["metadata"]["source"] == kept[0]["metadata"]["source"]  # the entry as JSON text
    meta, kept_meta = parquet[0]["metadata"], kept[0]["metadata"]
    assert set(kept_meta) <= set(meta)  # every field of the record, the judge's and --rescore's included
    assert {field: set(meta[field]) for field in ("usage", "verification")} == {
        field: set(kept_meta[field]) for field in ("usage", "verification")
    }
    assert parquet[0]["conversations"][2]["tool_calls"] == json.loads(kept[0]["conversations"][2]["tool_calls"])
    info = json.loads((export / "dataset_info.json").read_text())
    assert info["run"]["file_name"] == "llamafactory.json" and info["run"]["formatting"] == "sharegpt"


@EXPORTED
def test_openai_rows_answer_earlier_calls_and_keep_reasoning_apart(exported):
    rows = [json.loads(line) for line in (exported.run_dir / "export" / "openai.jsonl").read_text().splitlines()]
    assert [row["prompt_index"] for row in rows] == [r["prompt_index"] for r in exported.trajectories]
    parallel_seen = broken_seen = False
    for row in rows:
        # No system message: the template lists `tools` itself, a list of OpenAI tool objects.
        assert row["messages"][0]["role"] == "user" and all(m["role"] != "system" for m in row["messages"])
        assert all(tool["type"] == "function" for tool in row["tools"])
        assert {tool["function"]["name"] for tool in row["tools"]} >= {"terminal", "read_file"}
        called: set[str] = set()
        for message in row["messages"]:
            if message["role"] == "assistant":
                assert message["reasoning_content"] and "<think>" not in message["content"]
                assert "tool_calls" not in message or message["tool_calls"]  # the key only when there are calls
                for call in message.get("tool_calls", []):
                    arguments = call["function"]["arguments"]
                    assert isinstance(arguments, dict)  # an object; broken ones kept as {"_unparsed": text}
                    broken_seen |= set(arguments) == {"_unparsed"}
                    called.add(call["id"])
                parallel_seen |= len(message.get("tool_calls", [])) >= 3
            if message["role"] == "tool":
                assert message["tool_call_id"] in called  # answers an earlier call of this conversation
                assert isinstance(message["content"], str)
        assert row["model"] == "test-model" and row["run_name"] == "run" and row["sample_index"] == 0
    assert parallel_seen and broken_seen


@EXPORTED
def test_atif_rows_follow_the_schema(exported):
    for line in (exported.run_dir / "export" / "atif.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["schema_version"] == "ATIF-v1.4" and row["agent"]["name"] == "batch-runner"
        assert [step["step_id"] for step in row["steps"]] == list(range(1, len(row["steps"]) + 1))
        assert [step["source"] for step in row["steps"][:2]] == ["system", "user"]
        for step in row["steps"][2:]:
            assert step["source"] == "agent" and step["reasoning_content"]
            ids = [call["tool_call_id"] for call in step.get("tool_calls", [])]
            assert all(isinstance(call["arguments"], dict) for call in step.get("tool_calls", []))
            assert [r["source_call_id"] for r in step.get("observation", {}).get("results", [])] == ids
        assert row["final_metrics"]["total_prompt_tokens"] > 0


@EXPORTED
def test_the_card_names_every_file_and_what_shaped_the_data(exported, module_server):
    card = (exported.run_dir / "README.md").read_text()
    header = card.split("---\n")[1]
    for path in ("trajectories.jsonl", "export/openai.jsonl", "export/atif.jsonl", "export/trajectories.parquet"):
        assert f'path: "{path}"' in header
    host = module_server.base_url.split("//")[1].split("/")[0]
    assert f"at {host}," in card and "/v1" not in card
    assert "| `--distribution` | terminal\\_only |" in card and "| `--max_turns` | 10 |" in card
    assert "dropped" in card and "terminal" in card and "Reasoning coverage" in card
    # How to load it: datasets >= 5, with the features that let several runs load together.
    assert "datasets >= 5" in card and loading.load_line("openai", "export/openai.jsonl", "messages") in card


@EXPORTED
def test_no_file_of_the_run_folder_holds_the_api_key(exported):
    for path in exported.run_dir.rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path


def test_resume_of_a_finished_run_exports_without_a_model_call(run_here, server):
    first = run_here([{"prompt": "plain"}, {"prompt": "other"}], *TOOLS)
    assert first.code == 0 and not (first.run_dir / "export").exists()
    asked = len(server.requests)
    again = run_here([{"prompt": "plain"}, {"prompt": "other"}], *TOOLS, "--resume", "--export=openai,atif")
    assert again.code == 0, again.stderr
    assert len(server.requests) == asked
    assert sorted(p.name for p in (again.run_dir / "export").iterdir()) == ["atif.jsonl", "openai.jsonl"]
    # Once exported, a format stays in step with trajectories.jsonl at every later merge.
    (again.run_dir / "export" / "openai.jsonl").write_text("stale\n")
    third = run_here([{"prompt": "plain"}, {"prompt": "other"}], *TOOLS, "--resume")
    assert third.code == 0 and len(server.requests) == asked
    assert len((third.run_dir / "export" / "openai.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--export=openai,sharegpt", "--export: unknown format 'sharegpt'; choose from openai, llamafactory, atif"),
        ("--export=", "--export needs at least one name"),
        ("--report_max_trajectories=-1", "--report_max_trajectories must be at least 0"),
        ("--report=maybe", "--report must be true or false"),
    ],
)
def test_bad_export_and_report_flags_exit_2_without_requests(run_here, server, flag, message):
    result = run_here([{"prompt": "plain"}], *TOOLS, flag)
    assert result.code == 2 and message in result.stderr
    assert server.requests == []


@EXPORTED
def test_publishing_never_alters_the_trajectories_or_the_statistics(exported, tmp_path):
    folder = RunFolder(shutil.copytree(exported.run_dir, tmp_path / "run"))  # publish writes: a copy of the shared run
    before = {path: path.read_bytes() for path in (folder.trajectories, folder.statistics)}
    flags = {name: parameter.default for name, parameter in inspect.signature(main).parameters.items()}
    flags.update(dataset_file="x.jsonl", batch_size=1, run_name="run", model="mock", export=EVERY_FORMAT.split("=")[1])
    config, collected = build_config(flags), ReportData(10)
    exports = Exports(folder, config.exports, config.run_name)
    for line, record in folder.batch_lines(print):
        sample = read(record, line)
        collected.observe(sample, sample.discarded)
        exports.write(sample)
    publish(folder, json.loads(folder.statistics.read_text()), config, collected, Counter(), exports.commit())
    assert (folder.path / "report.html").exists() and (folder.path / "export" / "atif.jsonl").exists()
    assert {path: path.read_bytes() for path in before} == before
