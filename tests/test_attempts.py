"""Bounded attempts and failure classes: a prompt that always fails is sent at most --max_attempts times over
every invocation of a run (counted in the run folder, so a kill -9 cannot reset it, and a Ctrl-C does not use a
try); a prompt the endpoint refused for good (400) is not sent again; errors.jsonl, statistics.json and the exit
status say which is which."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import tempfile
from collections import Counter

from conftest import wait_for

from trajforge.environments.local import workspace_prefix
from trajforge.environments.settings import EnvironmentSettings
from trajforge.errors import UsageError
from trajforge.failures import failure_class
from trajforge.runfolder.attempts import AttemptLog, History, unit_id
from trajforge.runfolder.folder import RunFolder, entry_key

FLAGS = ["--distribution=terminal_only", "--max_retries=1"]
BROKEN = [{"prompt": f"always broken {i} [mock fail=500]"} for i in range(2)]
BAD = {"prompt": "bad request [mock fail=400]"}
FINE = {"prompt": "fine"}


def asked(server) -> Counter:
    return Counter(server.attempts)  # requests per prompt, counted as they arrive


def test_failing_prompts_stop_after_max_attempts_and_a_400_is_sent_once(run_here, server):
    entries = [*BROKEN, BAD, FINE]
    codes = [run_here(entries, *FLAGS).code]
    for _ in range(3):
        result = run_here(entries, *FLAGS, "--resume")
        codes.append(result.code)
    # Two invocations leave tries; the third uses the last one; the fourth sends nothing and says so.
    assert codes == [1, 1, 4, 4], result.stdout + result.stderr
    sent = asked(server)
    assert [sent[e["prompt"]] for e in BROKEN] == [3 * 2, 3 * 2]  # 3 tries of 2 requests (--max_retries=1)
    assert sent[BAD["prompt"]] == 1 and sent[FINE["prompt"]] == 3  # the 400 once in all; the fine one finished
    errors = result.jsonl("errors.jsonl")
    assert Counter((e["error_type"], e["error_class"]) for e in errors) == {
        ("api_http_500", "transient"): 6,
        ("api_http_400", "endpoint"): 1,
    }
    stats = result.statistics
    assert stats["error_classes"] == {"endpoint": 1, "transient": 6, "environment": 0, "budget": 0}
    assert (stats["exhausted"], stats["endpoint_failed"], stats["max_attempts"]) == (2, 1, 3)
    assert "Not sent again: 2 sample(s) out of --max_attempts=3, 1 failed at the endpoint" in result.stdout
    assert "2 sample(s) exhausted their 3 attempts" in result.stdout
    assert "--resume --max_attempts=4 --retry_failed=endpoint" in result.stdout
    # The command it printed sends them again: one more try each, the 400 included.
    again = run_here(entries, *FLAGS, "--resume", "--max_attempts=4", "--retry_failed=endpoint")
    # With --retry_failed=endpoint still given, the 400 has tries left: a resume like this one sends it (exit 1).
    assert again.code == 1 and "--max_attempts: 3 -> 4" in again.stderr + again.stdout
    sent = asked(server)
    assert [sent[e["prompt"]] for e in BROKEN] == [4 * 2, 4 * 2] and sent[BAD["prompt"]] == 2
    assert json.loads((again.run_dir / "run.json").read_text())["max_attempts"] == 4  # a setting a flag changes


def free(folder: RunFolder) -> bool:
    try:
        with folder.locked():
            return True
    except UsageError:
        return False


def _start(run, entries, *flags, run_name: str) -> subprocess.Popen:
    command = run.command(entries, *flags, run_name=run_name)
    return subprocess.Popen(command, cwd=run.tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def test_kill_9_uses_a_try_and_ctrl_c_does_not(run, run_here, server):
    server.latency = 3  # the first request of each run is in flight when it is stopped
    entries = [{"prompt": "long task"}]
    stopped = {}
    for name, signum in (("killed", signal.SIGKILL), ("interrupted", signal.SIGINT)):
        before = server.attempts["long task"]
        proc = _start(run, entries, *FLAGS, run_name=name)
        wait_for(lambda before=before: server.attempts["long task"] > before, what=f"the {name} run's request")
        os.killpg(proc.pid, signum)
        proc.communicate(timeout=60)
        stopped[name] = proc.returncode
        folder = RunFolder(run.tmp_path / "out" / name)
        wait_for(lambda folder=folder: free(folder), what=f"the {name} run's workers to be gone")
    assert stopped == {"killed": -signal.SIGKILL, "interrupted": 130}
    killed = RunFolder(run.tmp_path / "out" / "killed")
    assert not killed.errors.exists()  # the runner died: no line, but its try was on disk before the first call
    server.latency = 0
    sent = server.attempts["long task"]
    after_kill = run_here(entries, *FLAGS, "--resume", "--max_attempts=1", run_name="killed")
    assert after_kill.code == 4 and server.attempts["long task"] == sent  # its one try is spent: not sent
    # Nothing ran, yet what the killed run left (its sample's disk, workspace, cgroup) is gone with the resume.
    prefix = workspace_prefix(EnvironmentSettings(run_dir=str(after_kill.run_dir.resolve())))
    assert glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), glob.escape(prefix) + "*")) == []
    after_ctrl_c = run_here(entries, *FLAGS, "--resume", "--max_attempts=1", run_name="interrupted")
    assert after_ctrl_c.code == 0 and len(after_ctrl_c.trajectories) == 1  # pending, not tried: sent again
    assert not (after_ctrl_c.run_dir / "errors.jsonl").exists()  # interrupted writes no errors.jsonl line


def test_a_resume_with_nothing_to_run_says_in_one_line_what_it_could_not_clean(run_here, server):
    """(review 13) A resume with nothing left to run removes a killed run's leftovers on a thread of its own,
    without the backend's check: a backend that cannot work here (modal, its package missing) printed a
    thread's traceback. One warning line now; the resume ends as it would."""
    entries = [{"prompt": "done already"}]
    assert run_here(entries, *FLAGS).code == 0
    settings = json.loads((run_here.tmp_path / "out" / "run" / "run.json").read_text())
    settings["environment"] = "modal"  # what a run on another machine chose
    (run_here.tmp_path / "out" / "run" / "run.json").write_text(json.dumps(settings))
    again = run_here(entries, *FLAGS, "--resume")
    assert again.code == 0 and "Traceback" not in again.stderr, again.stderr
    assert "warning: what earlier runs left could not be removed: ModuleNotFoundError" in again.stderr, again.stderr


def test_each_error_type_has_its_class():
    assert {kind: failure_class(kind) for kind in ("api_http_400", "api_http_404", "api_http_422", "context_length")} \
        == dict.fromkeys(("api_http_400", "api_http_404", "api_http_422", "context_length"), "endpoint")  # fmt: skip
    transient = ("api_http_500", "api_http_429", "api_http_408", "api_timeout", "api_connection_refused",
                 "api_bad_reply", "crash_KeyError", "worker_died", "api_refused")  # fmt: skip
    assert {failure_class(kind) for kind in transient} == {"transient"}
    assert {failure_class(kind) for kind in ("environment", "setup_failed")} == {"environment"}
    assert {failure_class(kind) for kind in ("budget", "cost_unknown")} == {"budget"}


def test_an_older_run_folders_failures_count_as_tries_and_releases_only_take_back_their_own(tmp_path):
    folder = RunFolder(tmp_path)
    entry = {"prompt": "old"}
    old_line = {"prompt_index": 0, "error_type": "api_http_502", "message": "bad gateway", "attempts": 7}
    folder.errors.write_text("".join(json.dumps({**old_line, "source": entry}) + "\n" for _ in range(2)))
    unit = unit_id(entry_key(entry), 0)
    log = AttemptLog(folder)
    log.started("first", unit)
    log.released("second", [unit], "interrupted")  # another invocation's release takes nothing back
    log.started("second", unit)
    log.released("second", [unit], "interrupted")
    with log.path.open("a") as handle:
        handle.write('{"event": "start", "unit": "torn')  # cut by a crash
    history = History.read(folder)
    assert history.tries[unit] == 3 and history.last_class[unit] == "transient"
    assert history.held_back(unit, 3, ()) == "exhausted" and history.held_back(unit, 4, ()) is None
