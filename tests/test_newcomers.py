"""What a new user meets first, and a nightly script: the dataset card's snippet, what the docs say of a
kill -9, a mistyped run name on --resume, a run started by `cmd &`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from conftest import ROOT, InProcessRunner, run_cli, wait_for
from docs_examples import blocks

FLAGS = ["--distribution=terminal_only"]


def test_the_cards_load_snippet_imports_what_it_uses(run_here):
    for exports in ((), ("--export=openai",)):
        result = run_here([{"prompt": "ok"}], *FLAGS, *exports, run_name=f"card{len(exports)}")
        card = (result.run_dir / "README.md").read_text()
        snippet = card[card.index("```python") + len("```python") : card.rindex("```")]
        imported = snippet.split("import ", 1)[1].split("#")[0].split("\n")[0]
        body = snippet.split("\n", 2)[2]
        for name in (name.strip() for name in imported.split(",")):
            assert f"{name}(" in body, (name, snippet)


def test_the_docs_say_that_requests_in_flight_at_a_kill_9_are_paid_again():
    text = " ".join((ROOT / "docs" / "resume.md").read_text().split())
    assert "Their model requests that were in flight are paid for again by the resume" in text


def test_a_resume_of_a_mistyped_run_name_names_the_close_runs_and_sends_nothing(run_here, server):
    made = run_here([{"prompt": "ok"}], *FLAGS, run_name="nightly_qwen")
    assert made.code == 0
    sent = len(server.chat_requests())
    # No --batch_size: a resume takes it from run.json, so the old message asked for it, and with it a new run began.
    command = run_here.command([{"prompt": "ok"}], "--resume", run_name="nightly_qwne")[2:]
    for extra in ((), ("--batch_size=2",)):
        code, _, stderr = run_cli([arg for arg in command if not arg.startswith("--batch_size")] + list(extra))
        assert code == 2, stderr
        assert "no run folder" in stderr and "nightly_qwne" in stderr and "--run_name=nightly_qwen" in stderr
        assert not (run_here.tmp_path / "out" / "nightly_qwne").exists()
    assert len(server.chat_requests()) == sent
    # The honest twin: the right name resumes (nothing left: a re-merge, no request).
    assert run_here([{"prompt": "ok"}], "--resume", run_name="nightly_qwen").code == 0
    assert len(server.chat_requests()) == sent


def test_sigint_stops_a_run_started_with_sigint_ignored(run, server):
    """`cmd &` in a script: the shell starts the runner with SIGINT ignored; it must still stop for it."""
    server.latency = 0.3
    folder = run.tmp_path / "out" / "run"
    proc = subprocess.Popen(
        run.command([{"prompt": f"slow {i}"} for i in range(12)], *FLAGS),
        cwd=run.tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        wait_for(lambda: list(folder.glob("batch_*.jsonl")) and server.requests, what="a finished prompt")
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stdout + stderr
    assert "rerun with --resume" in stdout
    assert json.loads((folder / "checkpoint.json").read_text())["completed_prompts"]


def test_run_json_of_a_mock_run_names_mock_and_keeps_its_numbers_as_numbers(run_here):
    mock = InProcessRunner(run_here.tmp_path, None)  # --model=mock, no --base_url: the scripted model's own server
    assert mock([{"prompt": "ok"}], "--model=mock", *FLAGS).code == 0
    settings = json.loads((run_here.tmp_path / "out" / "run" / "run.json").read_text())
    assert settings["base_url"] == "mock"  # not the public endpoint it never reached
    assert settings["setup_timeout"] == 600.0 and settings["verify_timeout"] == 300.0
    resumed = mock([{"prompt": "ok"}, {"prompt": "more"}], "--resume")
    assert resumed.code == 0 and len(resumed.trajectories) == 2, resumed.stdout + resumed.stderr


def _help(*command: str, cwd) -> str:
    shown = subprocess.run([*command, "--help"], capture_output=True, text=True, cwd=cwd, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_help_shows_examples_and_exit_statuses_under_the_name_it_was_started_by(tmp_path):
    checkout = _help(sys.executable, str(ROOT / "batch_runner.py"), cwd=tmp_path)
    assert "usage: python batch_runner.py --dataset_file=FILE" in checkout
    assert "python batch_runner.py --dataset_file=data/example_prompts.jsonl --batch_size=4" in checkout
    for status in ("0 done", "2 bad flags", "3 the budget", "4 done", "130 interrupted"):
        assert status in checkout
    # What pip writes for the installed command (project.scripts): `batch-runner` is its name.
    script = tmp_path / "batch-runner"
    path = f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"  # this checkout's code, as the editable install has it
    script.write_text(f"#!{sys.executable}\n{path}from batch_runner import cli\nsys.exit(cli())\n")
    script.chmod(0o755)
    installed = _help(str(script), cwd=tmp_path)
    assert "usage: batch-runner --dataset_file=FILE" in installed and "python batch_runner.py" not in installed
    assert "  batch-runner --dataset_file=data/example_prompts.jsonl" in installed


def test_summary_json_is_the_one_thing_on_stdout(run_here):
    entries = [{"prompt": "ok"}, {"prompt": "[mock fail=500 times=9] down"}]
    result = run_here(entries, *FLAGS, "--max_retries=0", "--summary_json")
    summary = json.loads(result.stdout)  # one JSON object, nothing else
    assert result.code == summary["exit_status"] == 1 and summary["exit_cause"] == "remaining"
    assert summary["trajectories"] == 1 and summary["failed"] == 1 and summary["run_name"] == "run"
    assert summary["continue_command"].endswith("--resume") and "--summary_json" in summary["continue_command"]
    assert summary["files"]["trajectories"].endswith("trajectories.jsonl")
    assert "Run run" in result.stderr and "--resume" in result.stderr  # the human summary, on stderr
    refused = run_here(entries, *FLAGS, "--summary_json")  # the same run name again, without --resume
    assert refused.code == 2 and json.loads(refused.stdout)["exit_status"] == 2
    plain = run_here(entries, *FLAGS, "--resume", "--max_retries=0")  # the honest twin: the summary on stdout
    assert plain.code == 1 and "Run run" in plain.stdout


def test_check_tasks_with_summary_json_puts_its_verdict_on_stdout(run_here, server):
    sound = {"prompt": "make answer.txt", "solution": "echo 42 > answer.txt", "verify": "grep -q 42 answer.txt"}
    unsound = {"prompt": "anything passes", "solution": "true", "verify": "true"}
    result = run_here([sound, unsound], "--check_tasks", "--environment=local", "--summary_json")
    summary = json.loads(result.stdout)  # one JSON object, nothing else
    assert result.code == summary["exit_status"] == 1 and (summary["tasks"], summary["sound"]) == (2, 1)
    assert summary["unsound"] == [1] and summary["details"].endswith("task_check.jsonl")
    assert "1 of 2 tasks sound" in " ".join(result.stderr.split()) and not server.chat_requests()


def test_dry_run_checks_everything_and_prints_the_bounds_without_a_chat_request(run_here, server):
    server.models = ["test-model"]
    entries = [{"prompt": f"task {i}"} for i in range(3)]
    priced = ("--price_input=1", "--price_output=2", "--max_tokens=100", "--max_turns=4", "--n_samples=2")
    result = run_here(entries, *FLAGS, *priced, "--dry_run")
    assert result.code == 0, result.stdout + result.stderr
    said = " ".join(result.stdout.split())
    assert "Samples to run: 6 (3 dataset entries)" in said
    assert "Chat requests: at most 24 (--max_turns=4 x 6 samples)" in said
    assert "at most 2,400 (--max_tokens=100 per request), at most $0.0048 at --price_output" in said
    assert server.chat_requests() == [] and not result.run_dir.exists()
    unpriced = run_here(entries, *FLAGS, "--dry_run")
    assert unpriced.code == 0 and "no bound known (pass --price_input" in unpriced.stdout
    # Each check a run makes before its first request refuses here too, with nothing sent.
    server.models = ["another-model"]
    assert run_here(entries, *FLAGS, "--dry_run").code == 2  # the endpoint does not serve --model
    server.models = ["test-model"]
    missing = run_here([{"prompt": "fix it", "workspace": "no_such_folder"}], *FLAGS, "--dry_run")
    assert missing.code == 2 and "no_such_folder" in missing.stderr  # a task's path
    assert run_here(entries, *FLAGS, "--dry_run", "--max_turns=0").code == 2  # a flag
    assert server.chat_requests() == []
    # The honest twin: the same run without --dry_run sends its requests, and a dry run of its resume has nothing left.
    assert run_here(entries, *FLAGS).code == 0 and server.chat_requests()
    resumed = run_here(entries, *FLAGS, "--resume", "--dry_run")
    assert resumed.code == 0 and "Samples to run: 0 (0 dataset entries, 3 already done)" in " ".join(
        resumed.stdout.split()
    )


def _set_up_commands() -> list[str]:
    """The shell blocks of README's Set up section, in order."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Set up") : readme.index("\n## ", readme.index("## Set up"))]
    found = [block for block in blocks(ROOT / "README.md", ROOT) if block.shell and block.text.strip() in section]
    return [block.text.strip() for block in found]


def test_ci_makes_readmes_venv_and_runs_readmes_test_command_inside_it():
    venv, main_job, tests = _set_up_commands()  # the venv first, then exactly two set-up commands
    assert "--model=mock" in main_job and "pytest" in tests
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert venv in ci and tests in ci, "README's venv and test command, as written there"
    # Every install and every test runs inside that venv: nothing before it installs into the system's Python.
    before = ci[: ci.index(venv)]
    assert not [line for line in before if re.search(r"\bpip\b|pytest", line)], before
    assert ci.index(venv) < ci.index(tests) and not [line for line in ci if "python3 -m pip" in line]


def test_a_dry_run_with_summary_json_puts_its_bounds_on_stdout(run_here, server):
    entries = [{"prompt": f"task {i}"} for i in range(3)]
    result = run_here(entries, *FLAGS, "--max_turns=4", "--max_tokens=100", "--dry_run", "--summary_json")
    found = json.loads(result.stdout)
    assert result.code == 0 and found["dry_run"] and (found["samples"], found["max_requests"]) == (3, 12)
    assert found["max_completion_tokens"] == 1200 and found["max_completion_cost"] is None  # no prices given
    assert "Samples to run: 3" in result.stderr and server.chat_requests() == []
