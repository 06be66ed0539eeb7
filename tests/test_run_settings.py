"""The run folder remembers its run (run.json): --resume goes on with the settings that shape the data,
refuses a flag that contradicts them, and statistics' duration covers every invocation.

A --resume without --base_url would reach the public default endpoint if the run's own were lost: those
tests run inside a network namespace with only a loopback device (tests/offline.py), where the
scripted server also runs, so a mistake has nowhere to go."""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, write_dataset

import batch_runner
from trajforge.cli.config import RUN_SETTINGS, build_config, settle
from trajforge.cli.remembered import remembered, settle_flags
from trajforge.errors import UsageError
from trajforge.flags import Flag
from trajforge.flags.values import digest, whole

SECRET = "You are a secret system prompt nobody may read"
LOCAL = ["--environment=local", "--max_retries=0"]


def flags(**given) -> dict:
    """main()'s parameters as Fire hands them over: None for every remembered flag left out."""
    defaults = {name: p.default for name, p in inspect.signature(batch_runner.main).parameters.items()}
    return defaults | {"dataset_file": "d.jsonl", "batch_size": 1, "run_name": "r", "api_key": "k"} | given


def kept(**changes) -> dict:
    """run.json of a run made with the defaults and seed 5, with `changes`."""
    return build_config(flags(seed=5)).settings | changes


# -- the table and settle(), in-process ------------------------------------------------------------------------


def test_every_kept_flag_is_a_flag_left_none_and_the_execution_details_are_not_kept():
    parameters = inspect.signature(batch_runner.main).parameters
    names = [row.name for row in RUN_SETTINGS]
    assert len(names) == len(set(names))
    for name in names:
        assert parameters[name].default is None, f"--{name} must default to None so that --resume can tell it apart"
    free = {"dataset_file", "max_samples", "executor", "ray_address", "ray_shared_fs", "output_dir", "run_name"}
    free |= {"command_timeout", "request_timeout", "prompt_timeout", "max_retries", "verbose", "log_prefix_chars"}
    free |= {"require_reasoning", "api_key", "resume", "keep_workspaces", "no_cache", "export", "report"}
    assert not free & set(names)
    may_change = {row.name for row in RUN_SETTINGS if row.may_change}
    assert {"num_workers", "concurrency", "batch_size", "keep", "price_input", "price_output", "max_cost"} <= may_change


def test_left_out_flags_take_the_runs_values_given_ones_must_agree():
    run = kept(model="local", base_url="http://127.0.0.1:9/v1", distribution="terminal_only", max_turns=3)
    settled = settle(flags(), run, Path("run.json"))
    assert (settled["model"], settled["base_url"], settled["distribution"], settled["max_turns"]) == (
        "local",
        "http://127.0.0.1:9/v1",
        "terminal_only",
        3,
    )
    assert settled["vision_model"] == "anthropic/claude-sonnet-4.6"  # the run's own, not the new --model
    same = settle(flags(model="local", max_turns="3", base_url="http://127.0.0.1:9/v1/"), run, Path("run.json"))
    assert same["max_turns"] == "3"  # the same value spelled otherwise is the same
    # Execution settings may change freely.
    free = flags(num_workers=9, concurrency=5, request_timeout=1, require_reasoning=False, max_samples=2)
    assert settle(free, run, Path("run.json"))["num_workers"] == 9


@pytest.mark.parametrize(
    ("flag", "value", "was", "now"),
    [
        ("model", "other", '"anthropic/claude-sonnet-4.6"', '"other"'),
        ("max_turns", 3, "10", "3"),
        ("distribution", "minimal", '"default"', '"minimal"'),
        ("seed", 6, "5", "6"),
        ("providers_order", "a,b", "null", '["a", "b"]'),
        ("reasoning_disabled", True, "false", "true"),
        ("allow_private_urls", True, "false", "true"),
        ("environment", "docker", '"auto"', '"docker"'),
    ],
)
def test_a_contradicting_flag_is_refused_naming_it_and_both_values(flag, value, was, now):
    with pytest.raises(UsageError) as refused:
        settle(flags(**{flag: value}), kept(), Path("out/r/run.json"))
    message = str(refused.value)
    assert message.startswith(f"--{flag}: this run (in out/r/run.json) was made with {was}; --resume gave {now}.")


def test_the_ephemeral_prompt_is_kept_as_a_digest_and_must_come_again(tmp_path):
    made = build_config(flags(seed=1, ephemeral_system_prompt=SECRET)).settings
    assert made["ephemeral_system_prompt"] == digest(SECRET) and SECRET not in json.dumps(made)
    assert settle(flags(ephemeral_system_prompt=SECRET), made, tmp_path)["ephemeral_system_prompt"] == SECRET
    with pytest.raises(UsageError, match=r"^--ephemeral_system_prompt: this run was made with one .*pass the same"):
        settle(flags(), made, tmp_path)
    for other, run in ((SECRET + "!", made), (SECRET, kept())):
        with pytest.raises(UsageError, match=r"^--ephemeral_system_prompt: ") as refused:
            settle(flags(ephemeral_system_prompt=other), run, tmp_path)
        assert SECRET not in str(refused.value)  # a digest names it, never the text


def test_the_prefill_file_is_found_again_and_its_content_must_not_change(tmp_path):
    messages = [{"role": "user", "content": "few-shot question"}, {"role": "assistant", "content": "answer"}]
    path = tmp_path / "prefill.json"
    path.write_text(json.dumps(messages))
    made = build_config(flags(seed=1, prefill_messages_file=str(path))).settings
    assert made["prefill_messages_file"] == {"path": str(path), "sha256": digest(messages)}
    assert "few-shot" not in json.dumps(made)
    assert settle(flags(), made, tmp_path)["prefill_messages_file"] == str(path)
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(messages, indent=2))  # the same messages elsewhere are the same run
    assert settle(flags(prefill_messages_file=str(moved)), made, tmp_path)["prefill_messages_file"] == str(moved)
    path.write_text(json.dumps(messages[:1]))
    with pytest.raises(UsageError, match=r"^--prefill_messages_file: the run .* was made with .* which now reads"):
        settle(flags(), made, tmp_path)
    path.unlink()
    with pytest.raises(UsageError, match=r"prefill_messages_file holds .* does not exist"):
        settle(flags(), made, tmp_path)


def test_a_setting_may_be_allowed_to_grow_on_a_resume():
    """The seam for a setting such as a number of samples per prompt: more on a resume, never fewer."""
    rows = (Flag("n_samples", int, 1, "", "run", "remembered", parse=whole(1), agrees=lambda kept, now: now >= kept),)
    assert settle_flags(rows, {"n_samples": None}, {"n_samples": 3}, Path("run.json")) == {"n_samples": 3}
    assert settle_flags(rows, {"n_samples": "5"}, {"n_samples": 3}, Path("run.json")) == {"n_samples": "5"}
    assert remembered(rows, {"n_samples": "5"}) == {"n_samples": 5}  # what run.json keeps from then on
    with pytest.raises(UsageError, match=r"^--n_samples: this run \(in run.json\) was made with 3; --resume gave 2"):
        settle_flags(rows, {"n_samples": 2}, {"n_samples": 3}, Path("run.json"))


def test_without_seed_the_run_draws_one_and_keeps_it():
    seeds = {build_config(flags()).seed for _ in range(5)}
    assert all(isinstance(seed, int) for seed in seeds) and len(seeds) > 1
    config = build_config(flags())
    assert config.settings["seed"] == config.seed
    assert settle(flags(), config.settings, Path("run.json"))["seed"] == config.seed


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "run.json cannot be read"),
        ("[1, 2]", "run.json must hold a JSON object"),
        ('{"max_turns": "many"}', "run.json: max_turns holds 'many': --max_turns must be a whole number"),
        ('{"max_turns": 0}', "run.json: max_turns holds 0: --max_turns must be at least 1"),
        ('{"prefill_messages_file": 5}', "run.json: prefill_messages_file holds 5, which --prefill_messages_file"),
        ('{"prefill_messages_file": {"path": "/nowhere"}}', "run.json: prefill_messages_file holds"),
        ('{"distribution": "nonesuch"}', "run.json: distribution holds 'nonesuch': --distribution must be one of"),
        ('{"environment": ["local"]}', "run.json: environment holds ['local']: --environment must be one of"),
    ],
)
def test_a_damaged_run_json_is_refused_naming_it(tmp_path, content, message):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_text(content)
    with pytest.raises(UsageError) as refused:
        build_config(flags(resume=True, output_dir=str(tmp_path)))
    assert message in str(refused.value)


# -- whole runs ------------------------------------------------------------------------------------------------


def test_a_resume_goes_on_with_the_runs_settings_and_refuses_others(run_here, server):
    entries = [{"prompt": "one"}, {"prompt": "two [mock fail=500 times=1]"}]
    first = run_here(entries, *LOCAL, "--distribution=terminal_only", "--max_turns=4")
    assert first.code == 1, first.stdout
    stored = json.loads((first.run_dir / "run.json").read_text())
    assert (stored["model"], stored["base_url"], stored["max_turns"]) == ("test-model", server.base_url, 4)
    assert (stored["distribution"], stored["environment"]) == ("terminal_only", "local")
    assert isinstance(stored["seed"], int) and "api_key" not in stored
    assert "SECRET" not in (first.run_dir / "run.json").read_text()  # conftest's key
    asked, took = len(server.requests), first.statistics["duration_seconds"]

    refused = run_here(entries, "--resume", "--max_turns=5")
    assert refused.code == 2 and len(server.requests) == asked  # nothing sent
    assert "--max_turns: this run" in refused.stderr and "made with 4; --resume gave 5" in refused.stderr

    # Execution and merge settings may change; the data-shaping ones come from run.json.
    second = run_here(entries, "--resume", "--num_workers=1", "--concurrency=2", "--require_reasoning=False")
    assert second.code == 0, second.stdout + second.stderr
    assert {r["toolsets_used"] == ["file", "terminal"] for r in second.trajectories} == {True}
    assert second.statistics["model"] == "test-model" and second.statistics["distribution"] == "terminal_only"
    # Workers and concurrency are the run's from now on, and the change is said once.
    assert json.loads((first.run_dir / "run.json").read_text()) == stored | {"num_workers": 1, "concurrency": 2}
    assert "--num_workers: 4 -> 1" in second.stderr and "--concurrency: 1 -> 2" in second.stderr
    assert second.statistics["duration_seconds"] > took > 0  # both invocations' (the refused one never began)


def test_a_folder_without_run_json_resumes_from_the_flags_and_remembers_from_then_on(run_here, server):
    entries = [{"prompt": "one"}, {"prompt": "two [mock fail=500 times=1]"}]
    first = run_here(entries, *LOCAL, "--distribution=terminal_only")
    (first.run_dir / "run.json").unlink()  # as a folder made before run.json existed
    checkpoint = json.loads((first.run_dir / "checkpoint.json").read_text())
    del checkpoint["duration_seconds"]
    (first.run_dir / "checkpoint.json").write_text(json.dumps(checkpoint))
    second = run_here(entries, *LOCAL, "--distribution=terminal_only", "--resume")
    assert second.code == 0, second.stdout
    assert len(second.trajectories) == 2 and second.statistics["duration_seconds"] > 0
    assert json.loads((first.run_dir / "run.json").read_text())["distribution"] == "terminal_only"
    third = run_here(entries, "--resume", "--distribution=minimal")
    assert third.code == 2 and "--distribution: this run" in third.stderr


def test_a_first_invocation_that_ran_nothing_can_be_started_again(run_here, tmp_path):
    """run.json alone (the run stopped before any prompt ended) does not make the folder a run."""
    (tmp_path / "out" / "run").mkdir(parents=True)
    (tmp_path / "out" / "run" / "run.json").write_text(json.dumps({"model": "old", "max_turns": 2}))
    result = run_here([{"prompt": "one"}], *LOCAL, "--distribution=terminal_only")
    assert result.code == 0, result.stderr
    assert json.loads((result.run_dir / "run.json").read_text())["model"] == "test-model"


# -- resumes without --base_url, where nothing but loopback exists ---------------------------------------------


def offline(tmp_path: Path, commands: list[dict]) -> tuple[list[dict], list[dict]]:
    """Run batch_runner.py `commands` inside a network namespace of their own with the scripted server
    (tests/offline.py); (per command: code, stdout, stderr, statistics), and the server's request log."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode:
        pytest.skip("no network namespaces here (unshare -rn): a resume without --base_url is not safe to test")
    plan = {"commands": commands, "run_dir": str(tmp_path / "out" / "run"), "result": str(tmp_path / "result.json")}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    helper = ROOT / "tests" / "offline.py"
    script = f'ip link set lo up && exec "{sys.executable}" "{helper}" "{tmp_path / "plan.json"}"'
    proc = subprocess.run(["unshare", "-rn", "sh", "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    return result["results"], result["requests"]


def command(tmp_path: Path, entries: list[dict], *extra: str) -> list[str]:
    dataset = write_dataset(tmp_path / "prompts.jsonl", entries)
    common = [f"--dataset_file={dataset}", "--batch_size=2", "--run_name=run", f"--output_dir={tmp_path / 'out'}"]
    return [str(ROOT / "batch_runner.py"), *common, *extra]


def test_resume_without_model_or_base_url_of_a_finished_local_run(tmp_path):
    """The reported bug: it exited 2 for a missing key, or with OPENROUTER_API_KEY set rewrote
    statistics.json to another model and distribution."""
    entries = [{"prompt": "one"}, {"prompt": "two"}]
    first = command(tmp_path, entries, "--model=local-model", "--base_url={base_url}", "--distribution=terminal_only")
    resume = command(tmp_path, entries, "--resume")
    key = {"OPENROUTER_API_KEY": "sk-or-not-a-real-key-0123456789"}
    results, requests = offline(tmp_path, [{"args": first + LOCAL}, {"args": resume}, {"args": resume, "env": key}])
    made, plain, keyed = results
    assert made["code"] == 0, made["stdout"] + made["stderr"]
    for after in (plain, keyed):
        assert after["code"] == 0, after["stdout"] + after["stderr"]
        assert "0 to run" in after["stdout"] and "no API key" not in after["stderr"]
        assert (after["statistics"]["model"], after["statistics"]["distribution"]) == ("local-model", "terminal_only")
    assert keyed["statistics"]["trajectories"] == 2
    durations = [r["statistics"]["duration_seconds"] for r in results]
    assert durations[0] < durations[1] < durations[2]  # each invocation's time added
    assert {r["path"] for r in requests} == {"/v1/chat/completions"} and len(requests) >= 2


def test_resume_without_flags_sends_the_rest_to_the_same_endpoint_with_the_same_tool_draw(tmp_path, run_here):
    """Five prompts fail in the first invocation; the resume, given neither --model, --base_url,
    --distribution nor --seed, runs them on the run's endpoint and model, each offered the toolsets
    that the first invocation drew for it (shown by a fresh run with the stored seed)."""
    entries = [{"prompt": f"flaky {i} [mock fail=500 times=1 turns=0]"} for i in range(5)]
    entries.append({"prompt": "steady [mock turns=0]"})
    first = command(tmp_path, entries, "--model=local-model", "--base_url={base_url}", "--distribution=development")
    results, requests = offline(tmp_path, [{"args": first + LOCAL}, {"args": command(tmp_path, entries, "--resume")}])
    made, resumed = results
    assert made["code"] == 1 and made["statistics"]["failed"] == 5, made["stdout"] + made["stderr"]
    assert resumed["code"] == 0, resumed["stdout"] + resumed["stderr"]
    assert {r["body"]["model"] for r in requests if r["path"].endswith("/chat/completions")} == {"local-model"}
    run_dir = tmp_path / "out" / "run"
    records = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 6 and {r["metadata"]["model"] for r in records} == {"local-model"}
    seed = json.loads((run_dir / "run.json").read_text())["seed"]
    drawn = {r["prompt_index"]: r["toolsets_used"] for r in records}
    assert len({tuple(toolsets) for toolsets in drawn.values()}) > 1  # the coin flips differ between prompts
    # The same seed given to a fresh run, which never failed, draws the same toolsets for each prompt.
    fresh = run_here(entries, "--environment=local", "--distribution=development", f"--seed={seed}", run_name="fresh")
    assert fresh.code == 0, fresh.stdout
    assert {r["prompt_index"]: r["toolsets_used"] for r in fresh.trajectories} == drawn
