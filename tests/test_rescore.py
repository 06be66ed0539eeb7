"""--rescore (run/rescore.py): a run made without any verification, verified again later without a request
to the agent's endpoint: by a judge on a second endpoint, and by hidden tests added to the dataset since,
where replaying the recorded calls rebuilds each sample's workspace (a sample that wrote the right file
passes, one that did not fails); a replayed command whose output differs marks its sample diverged."""

from __future__ import annotations

import json
import socket

import orjson
from conftest import as_record, source, write_dataset
from test_judge import judged, rubric

from trajforge.runfolder.folder import RunFolder

FLAGS = ["--distribution=terminal_only", "--environment=local", "--seed=7"]
WRITES = "write the answer [mock alternate command=echo%2042%20>%20answer.txt]"  # every other sample writes it
CHECK = {"check.sh": 'test "$(cat answer.txt)" = 42'}


def batch_bytes(run_dir) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run_dir.glob("batch_*.jsonl"))}


def rescore(run_here, entries, *flags):
    return run_here(entries, *FLAGS, "--resume", "--rescore", *flags)


def test_a_judge_re_scores_a_run_made_without_verification(run_here, server, judge, tmp_path):
    entries = [{"prompt": f"explain topic {i}"} for i in range(3)]
    first = run_here(entries, *FLAGS, "--n_samples=2")
    assert first.code == 0, first.stdout + first.stderr
    assert not any(row["metadata"]["verification"]["verified"] for row in first.trajectories)
    before, asked = batch_bytes(first.run_dir), len(server.requests)

    again = rescore(run_here, entries, rubric(tmp_path), f"--judge_base_url={judge.base_url}", "--keep=best")
    assert again.code == 0, again.stdout + again.stderr
    assert len(server.requests) == asked  # not one request to the agent's endpoint
    assert len(judged(judge)) == 6 and "Re-scored 6 samples into rescore_1.jsonl" in again.stdout
    assert "their samples verified again (0 unfinished" in again.stdout
    assert "--judge: none -> " in again.stdout + again.stderr  # the change, said once
    assert batch_bytes(again.run_dir) == before  # the old journal is never rewritten
    rows = [as_record(record) for _, record in RunFolder(again.run_dir).batch_lines(print)]  # newest verification
    assert all(r["metadata"]["verification"]["verified"] and r["metadata"]["usage"]["judge_tokens"] for r in rows)
    assert again.jsonl("preferences.jsonl") and len(again.trajectories) <= 3
    kept = json.loads((again.run_dir / "run.json").read_text())
    assert [r["judge"]["path"] for r in kept["rescores"]] == [str(tmp_path / "rubric.md")]

    # A plain resume afterwards keeps the judge (run.json has it), and neither model is called again.
    judges = len(judge.requests)
    plain = run_here(entries, *FLAGS, "--resume", f"--judge_base_url={judge.base_url}")
    assert plain.code == 0, plain.stdout + plain.stderr
    assert len(server.requests) == asked and len(judge.requests) == judges
    assert plain.statistics["verification"] == again.statistics["verification"]

    # Without --rescore, a resume may not change what verification is.
    refused = run_here(entries, *FLAGS, "--resume", f"--judge={tmp_path / 'other.md'}")
    assert refused.code == 2


def test_hidden_tests_added_later_pass_the_sample_that_wrote_the_file_and_fail_the_other(run_here, server, tmp_path):
    first = run_here([{"prompt": WRITES}], *FLAGS, "--n_samples=2")
    assert first.code == 0, first.stdout + first.stderr
    asked = len(server.requests)
    now = [{"prompt": WRITES, "tests": CHECK, "verify": "sh $TESTS_DIR/check.sh"}]
    again = rescore(run_here, now)
    assert again.code == 0, again.stdout + again.stderr
    assert len(server.requests) == asked
    # Which sample wrote the file depends on which reached the scripted model first: its recorded command says.
    said = {r["metadata"]["sample_index"]: json.dumps(r["conversations"]) for r in again.trajectories}
    wrote = {
        "not solving it" not in said[r["metadata"]["sample_index"]]: r["metadata"]["verification"]
        for r in again.trajectories
    }
    assert wrote[True]["passed"] is True and wrote[False]["passed"] is False, wrote
    assert all(not v["replay_diverged"] and v["output"].startswith("replay: as recorded") for v in wrote.values())
    assert again.statistics["replay_diverged"] == 0
    assert (again.run_dir / "batch_0.jsonl").exists() and (again.run_dir / "rescore_1.jsonl").exists()


def test_a_replayed_command_with_another_output_marks_the_sample_diverged(run_here, server, tmp_path):
    random = {"prompt": "draw [mock command=cat%20/proc/sys/kernel/random/uuid]"}
    steady = {"prompt": "count [mock command=echo%20steady]"}
    first = run_here([random, steady], *FLAGS)
    assert first.code == 0, first.stdout + first.stderr
    now = [entry | {"verify": "true"} for entry in (random, steady)]
    again = rescore(run_here, now)
    assert again.code == 0, again.stdout + again.stderr
    by_prompt = {source(r)["prompt"]: r["metadata"]["verification"] for r in again.trajectories}
    assert by_prompt[random["prompt"]]["replay_diverged"] is True
    assert "turn 1 terminal: recorded" in by_prompt[random["prompt"]]["output"]
    assert by_prompt[steady["prompt"]]["replay_diverged"] is False  # the twin
    assert again.statistics["replay_diverged"] == 1


def test_a_second_rescore_is_a_new_file_and_the_newest_wins(run_here, server, tmp_path):
    entries = [{"prompt": "plain"}]
    assert run_here(entries, *FLAGS).code == 0
    assert rescore(run_here, entries, rubric(tmp_path, "[judge score=0.2]")).code == 0
    second = rescore(run_here, entries, rubric(tmp_path, "[judge score=0.9]", "second.md"))
    assert second.code == 0, second.stdout + second.stderr
    assert "into rescore_2.jsonl" in second.stdout, second.stdout + second.stderr
    assert second.trajectories[0]["metadata"]["verification"]["reward"] == 0.9, second.stdout + second.stderr
    lines = [orjson.loads(line) for line in (second.run_dir / "rescore_1.jsonl").read_bytes().splitlines()]
    assert lines[0]["verification"]["reward"] == 0.2  # the earlier one is kept


def test_rescore_needs_resume(run_here, server, tmp_path):
    write_dataset(tmp_path / "d.jsonl", [{"prompt": "p"}])
    result = run_here([{"prompt": "p"}], *FLAGS, "--rescore")
    assert (
        result.code == 2 and "--rescore verifies the finished samples of a run again" in result.stdout + result.stderr
    )
    assert not server.requests


def test_a_command_the_redaction_changed_is_not_replayed_and_the_sample_is_diverged(run_here, server):
    secret = "the ephemeral instructions 0123456789"
    leaky = {"prompt": "leak [mock quote]"}  # its first command echoes the ephemeral prompt: saved redacted
    first = run_here([leaky], *FLAGS, f"--ephemeral_system_prompt={secret}")
    assert first.code == 0, first.stdout + first.stderr
    again = rescore(run_here, [leaky | {"verify": "true"}], f"--ephemeral_system_prompt={secret}")
    assert again.code == 0, again.stdout + again.stderr
    verification = again.trajectories[0]["metadata"]["verification"]
    assert verification["replay_diverged"] is True
    assert "not replayed, the secret redaction changed it" in verification["output"]


def test_a_judge_endpoint_that_fails_fails_the_sample_and_a_resume_retries_it(run_here, server, tmp_path):
    from trajforge.mock.server import MockServer

    with socket.socket() as probe:  # a port nothing listens on, until the judge starts there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    entries = [{"prompt": "judged"}]
    flags = [*FLAGS, rubric(tmp_path), f"--judge_base_url=http://127.0.0.1:{port}/v1", "--max_retries=0"]
    first = run_here(entries, *flags)
    assert first.code == 1, first.stdout + first.stderr
    assert not first.batch_lines and first.jsonl("errors.jsonl")  # failed, not recorded with a made-up verdict
    agent_calls = len(server.chat_requests())
    judge = MockServer()
    judge.start(port=port)
    try:
        again = run_here(entries, *flags, "--resume")
    finally:
        judge.stop()
    assert again.code == 0, again.stdout + again.stderr
    assert again.trajectories[0]["metadata"]["verification"]["verified"] is True and len(judged(judge)) == 1
    assert len(server.chat_requests()) == agent_calls  # the agent's calls came from the cache
