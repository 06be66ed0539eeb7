"""Tasks as data: files, a workspace folder and a setup in place before the first turn, hidden tests the
agent cannot find (a scripted model searches for them, and leaves a watcher behind), setup failures that
cost no model call, and --check_tasks, which calls no model at all. Local, bwrap and docker."""

from __future__ import annotations

import base64
import json
import secrets
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import ROOT, source, tool_results, write_dataset
from test_environments import _available

from trajforge.environments import userns
from trajforge.errors import UsageError
from trajforge.run.dataset import load_dataset
from trajforge.runfolder.folder import entry_key

ALPHA = "batch-runner-test/alpha:1"  # built by .ci/docker-up: busybox, no python
# In the hidden tests only, and new in each session (a local agent sees the host's /tmp, where other tests
# run at the same time); the commands spell it in two quoted halves.
HALF = secrets.token_hex(6)
MARK = f"SECRET{HALF}"
FIND = f'find / -maxdepth 4 \\( -path /proc -o -path /sys \\) -prune -o -name "*SECRET""{HALF}*" -print 2>/dev/null'
# Left behind by the agent: for 4 s, copies whatever is where each backend puts the tests (this sample's
# host folders are named after its workspace) into seen.txt, as fast as it can.
GLOBS = '"${PWD%-*}"-tests-*/* /tests/* /batch-runner-tests-*/*'
WATCH = (
    "(setsid sh -c 'end=$(($(date +%s)+4)); while [ $(date +%s) -lt $end ]; do "
    f"cat {GLOBS} >> seen.txt 2>/dev/null; done' </dev/null >/dev/null 2>&1 &)"
)
# The verify command waits a moment first: a watcher left running has had its chance to copy the tests.
HIDDEN = {f"hidden_{MARK}.sh": f"# {MARK}\ngrep -qx 42 answer.txt\n"}
VERIFY = f'sleep 0.5; test -f "$TESTS_DIR/hidden_{MARK}.sh" && ! test -s seen.txt && sh "$TESTS_DIR/hidden_{MARK}.sh"'


def steer(command: str, turns: int = 1) -> str:
    return f"[mock turns={turns} command={quote(command, safe='')}]"


def flags(kind: str) -> list[str]:
    images = [f"--default_image={ALPHA}"] if kind == "docker" else []
    return ["--distribution=terminal_only", f"--environment={kind}", "--num_workers=1", *images]


@pytest.fixture(params=["local", "bwrap", "docker"])
def backend(request) -> str:
    return _available(request)


# -- the dataset's fields ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"files": {"../out.txt": "x"}}, "leaves the workspace"),
        ({"files": {"/etc/passwd": "x"}}, "leaves the workspace"),
        ({"tests": {"a/../../b": "x"}}, "leaves the workspace"),
        ({"files": {"a\u0001.txt": "x"}}, "holds a NUL or control character"),  # what a cwd may not hold either
        ({"tests": {"n" * 300: "x"}}, "has a name of 300 bytes, more than 255"),
        ({"files": ["a.txt"]}, '"files" must be an object'),
        ({"files": {"a.bin": {"base64": "!!"}}}, "not valid base64"),
        ({"files": {"a.txt": 3}}, "must be text"),
        ({"workspace": "no/such/folder"}, "is not a directory"),
        ({"tests": "no/such/tests"}, "is not a directory"),
        ({"setup": ""}, '"setup" must be a non-empty shell command'),
        ({"solution": 7}, '"solution" must be a non-empty shell command'),
    ],
)
def test_bad_task_fields_stop_the_run_naming_the_line(tmp_path, fields, problem):
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": "fine"}, {"prompt": "task", **fields}])
    with pytest.raises(UsageError, match="line 2: ") as caught:
        load_dataset(dataset)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"workspace": "loop"}, """line 1: "workspace" 'loop' is a link that loops"""),
        ({"tests": "loop", "verify": "true"}, """line 1: "tests" 'loop' is a link that loops"""),
        ({"workspace": "ws", "cwd": "l"}, """line 1: "cwd" 'l' is a link that loops in the workspace folder"""),
        ({"workspace": "ws", "cwd": "sub"}, None),  # the honest twin: a cwd in the workspace
    ],
)
def test_a_link_loop_a_dataset_entry_names_stops_the_run_naming_the_line(run, server, tmp_path, fields, problem):
    """(review 12) Path.resolve raised RuntimeError on a loop of links (Python 3.11): a traceback, exit 1."""
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "ws" / "sub").mkdir(parents=True)
    (tmp_path / "ws" / "l").symlink_to("l")
    done = run([{"prompt": "task [mock command=true]", **fields}], "--distribution=terminal_only")
    if problem is None:
        assert done.code == 0, done.stderr
        return
    assert (done.code, server.chat_requests()) == (2, []) and "Traceback" not in done.stderr, done.stderr
    assert problem in done.stderr, done.stderr


def test_folders_are_relative_to_the_dataset_file(tmp_path, monkeypatch):
    (tmp_path / "data" / "repo").mkdir(parents=True)
    dataset = write_dataset(tmp_path / "data" / "d.jsonl", [{"prompt": "p", "workspace": "repo"}])
    monkeypatch.chdir("/")
    assert load_dataset(dataset)[0].data["workspace"] == "repo"


def test_entries_that_differ_only_in_what_the_task_brings_are_different_entries():
    plain = {"prompt": "fix it"}
    assert entry_key(plain) == json.dumps(["fix it", None, None, None])  # keys of earlier runs stay
    keys = {
        entry_key({**plain, **extra})
        for extra in ({}, {"files": {"a": "1"}}, {"files": {"a": "2"}}, {"setup": "true"}, {"tests": {"t": "1"}})
    }
    assert len(keys) == 5
    assert entry_key({**plain, "solution": "a"}) == entry_key(plain)  # the oracle never reaches the agent


# -- whole runs ----------------------------------------------------------------------------------


def test_files_workspace_and_setup_are_in_place_before_the_first_turn(backend, tmp_path, run_here, server):
    (tmp_path / "repo" / "pkg").mkdir(parents=True)
    (tmp_path / "repo" / "pkg" / "code.txt").write_text("from the repository\n")
    (tmp_path / "repo" / "run.sh").write_text("echo run.sh ran\n")
    (tmp_path / "repo" / "run.sh").chmod(0o755)
    entry = {
        "prompt": "look " + steer("cat pkg/code.txt given.txt setup.log; od -An -tx1 blob.bin; ./run.sh"),
        "workspace": "repo",
        "files": {"given.txt": "from files\n", "blob.bin": {"base64": "AAH/"}},
        "setup": "test -f given.txt && test -f pkg/code.txt && echo setup ran > setup.log",
    }
    result = run_here([entry], *flags(backend), timeout=240)
    assert result.code == 0, result.stdout + result.stderr
    first = tool_results(result.trajectories[0]).split("</tool_response>")[0]
    assert "from the repository" in first and "from files" in first and "setup ran" in first
    assert "00 01 ff" in first and "run.sh ran" in first  # bytes as given, an executable kept executable


def test_the_agent_cannot_find_the_tests_and_a_solved_task_passes(backend, run_here, server):
    solve = f"{WATCH}; {FIND}; echo 42 > answer.txt"
    entries = [
        {"prompt": "solve " + steer(solve), "tests": HIDDEN, "verify": VERIFY},
        {"prompt": "idle " + steer(WATCH), "tests": HIDDEN, "verify": VERIFY},
    ]
    result = run_here(entries, *flags(backend), timeout=240)
    assert result.code == 0, result.stdout + result.stderr
    by_prompt = {json.loads(r["metadata"]["source"])["prompt"].split()[0]: r for r in result.trajectories}
    assert MARK not in tool_results(by_prompt["solve"])  # find saw no tests
    solved, idle = (by_prompt[p]["metadata"]["verification"] for p in ("solve", "idle"))
    assert solved["passed"] is True, solved  # the tests were there at verification, the watcher gone
    assert idle["passed"] is False
    assert not any(MARK in json.dumps(r) for r in server.chat_requests())  # never sent to the model


def test_a_failing_setup_fails_the_sample_without_a_model_call(run_here, server):
    entries = [
        {"prompt": "broken " + steer("true"), "setup": "echo the-setup-said-this; exit 3"},
        {"prompt": "fine " + steer("true"), "setup": "true"},
    ]
    result = run_here(entries, *flags("local"))
    assert result.code == 1, result.stdout + result.stderr
    assert {r["prompt"].split()[0] for r in server.chat_requests()} == {"fine"}
    (error,) = result.jsonl("errors.jsonl")
    assert error["error_type"] == "setup_failed" and "the-setup-said-this" in error["message"]
    assert "exit status 3" in error["message"]
    report = (result.run_dir / "report.html").read_text()
    assert '"setup_failed_total":1' in report and '"failed_total":0' in report  # shown apart from model failures
    again = run_here(entries, *flags("local"), "--resume")  # failed, so redone on --resume
    assert again.code == 1 and len(again.jsonl("errors.jsonl")) == 2


# -- --check_tasks ------------------------------------------------------------------------------


def checked(backend: str) -> list[dict]:
    return [
        {"prompt": "good", "tests": HIDDEN, "verify": VERIFY, "setup": "true", "solution": "echo 42 > answer.txt"},
        {"prompt": "broken oracle", "tests": HIDDEN, "verify": VERIFY, "solution": "echo 41 > answer.txt"},
        {
            "prompt": "trivially passing",
            "tests": {"t.sh": "true"},
            "verify": 'sh "$TESTS_DIR/t.sh"',
            "solution": "true",
        },
    ]


def test_check_tasks_calls_no_model_and_names_the_unsound_tasks(backend, run_here, server):
    result = run_here(checked(backend), "--check_tasks", "--n_samples=3", *flags(backend), timeout=240)
    assert result.code == 1, result.stdout + result.stderr
    assert server.requests == []
    lines = result.jsonl("task_check.jsonl")
    assert [(c["index"], c["oracle_passed"], c["noop_passed"], c["ok"]) for c in lines] == [
        (0, True, False, True),
        (1, False, False, False),
        (2, True, True, False),
    ]
    assert "Tasks that are not sound" in result.stdout and "1 of 3 tasks sound" in result.stdout
    table = result.stdout.split("Tasks that are not sound")[1]
    assert "broken oracle" in table and "the oracle fails" in table and "doing nothing passes" in table
    assert "good" not in table
    good = run_here(checked(backend)[:1], "--check_tasks", *flags(backend), run_name="good")
    assert good.code == 0 and "1 of 1 tasks sound" in good.stdout and server.requests == []


def test_the_table_names_a_long_oracle_s_verdict_not_the_cut(tmp_path, run_here, server):
    noisy = {"prompt": "noisy", "solution": "head -c 5000 /dev/zero | tr '\\0' x; echo", "verify": "test -f done.txt"}
    result = run_here([noisy], "--check_tasks", *flags("local"))
    assert result.code == 1, result.stdout + result.stderr
    table = result.stdout.split("Tasks that are not sound")[1]
    assert "output cut" not in table and "reward 0.0" in table, table


def test_the_example_tasks_are_sound_and_the_mock_solves_one(tmp_path, run_here, server):
    dataset = ROOT / "data" / "example_tasks.jsonl"
    check = run_here(dataset, "--check_tasks", *flags("local"), run_name="check")
    assert check.code == 0, check.stdout + check.stderr
    assert [c["ok"] for c in check.jsonl("task_check.jsonl")] == [True, True, True] and server.requests == []
    result = run_here(dataset, *flags("local"))
    passed = [
        r["metadata"]["verification"]["passed"] for r in sorted(result.trajectories, key=lambda r: r["prompt_index"])
    ]
    assert passed == [False, True, False]  # the mock fixes slugify (its prompt steers it), nothing else


@pytest.mark.parametrize(
    "fake", ["echo 'import os; os._exit(0)' >> textkit/__init__.py", "echo 'raise SystemExit(0)' >> textkit/stats.py"]
)
def test_an_exit_in_the_code_under_test_does_not_pass_an_example_task(tmp_path, run_here, server, fake):
    # The hidden test runs the repository's code in a child process and decides in its own.
    data = tmp_path / "data"
    shutil.copytree(ROOT / "data" / "example_tasks", data / "example_tasks")
    median = json.loads((ROOT / "data" / "example_tasks.jsonl").read_text().splitlines()[0])
    dataset = data / "tasks.jsonl"
    dataset.write_text(json.dumps(median | {"prompt": median["prompt"] + " " + steer(fake)}) + "\n")
    result = run_here(dataset, *flags("bwrap" if Path("/usr/bin/bwrap").exists() else "local"))
    assert result.code == 0, result.stdout + result.stderr
    assert result.trajectories[0]["metadata"]["verification"]["passed"] is False


def test_a_python_verifier_finds_the_tests_at_env_tests_dir(tmp_path, run_here, server):
    (tmp_path / "v.py").write_text(
        "def check(record, env):\n"
        "    text = env.read_file(env.tests_dir + '/expected.txt').strip()\n"
        "    return float(env.read_file('answer.txt').strip() == text)\n"
    )
    entry = {"prompt": "p " + steer("echo 42 > answer.txt"), "tests": {"expected.txt": "42\n"}}
    result = run_here([entry], *flags("bwrap" if Path("/usr/bin/bwrap").exists() else "local"), "--verifier=v.py:check")
    assert result.code == 0, result.stdout + result.stderr
    assert result.trajectories[0]["metadata"]["verification"]["passed"] is True


# Model code that reads the hidden test's expected values (where $TESTS_DIR or /tests points) and answers
# with them: every example task would pass unsolved if the code under test could read its tests.
READS_THE_TESTS = r"""
import ast, glob, os, re
from . import money, slug, stats
for _path in glob.glob(os.path.join(os.environ.get("TESTS_DIR", "/tests"), "*.py")) + glob.glob("/tests/*.py"):
    try:
        _found = re.search(r"^CASES, EXPECTED = (.*)$", open(_path).read(), re.M)
    except OSError:
        continue
    if _found:
        _cases, _expected = ast.literal_eval(_found.group(1))
        stats.median = slug.slugify = money.cents_to_text = lambda v: _expected[_cases.index(v)]
"""


def test_code_under_test_cannot_read_the_example_tasks_hidden_tests(tmp_path, run_here, server):
    # Issue 31, row 5: the hidden tests run the code as the agent's uid ($AS_AGENT), which cannot read them.
    if not userns.possible():
        pytest.skip("two uids need a runner that is root on the host")
    data = tmp_path / "data"
    shutil.copytree(ROOT / "data" / "example_tasks", data / "example_tasks")
    tasks = [json.loads(line) for line in (ROOT / "data" / "example_tasks.jsonl").read_text().splitlines()]
    attack = f"echo {base64.b64encode(READS_THE_TESTS.encode()).decode()} | base64 -d >> textkit/__init__.py"
    entries = [t | {"prompt": f"{n} attack {steer(attack)}"} for n, t in enumerate(tasks)]
    entries += [t | {"prompt": f"{n} honest {steer(t['solution'])}"} for n, t in enumerate(tasks)]
    dataset = data / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    result = run_here(dataset, *flags("bwrap"), "--concurrency=6")
    assert result.code == 0, result.stdout + result.stderr
    verdicts = {source(r)["prompt"].split(" [")[0]: r["metadata"]["verification"] for r in result.trajectories}
    assert [verdicts[f"{n} attack"]["passed"] for n in range(3)] == [False] * 3, verdicts
    assert [verdicts[f"{n} honest"]["passed"] for n in range(3)] == [True] * 3, verdicts
