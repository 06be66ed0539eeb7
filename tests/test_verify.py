"""Verification in-process: the reward rules, the dataset's `verify` field, object checks, the Python
verifier's answers (trajforge.verification.checks), and verification in a real local environment, the verifier's
child process included (trajforge.verification.python_verifier): reading a file through the handle, raising, hanging,
answering garbage."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from trajectory import ToolCall, Turn
from trajforge.cli.config import RUN_SETTINGS
from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.errors import UsageError
from trajforge.flags.values import FlagError, verifier_spec
from trajforge.run.dataset import load_dataset
from trajforge.verification.checks import verify_sample
from trajforge.verification.kinds import CheckContext, check_object, command_reward, spec_problem
from trajforge.verification.python_verifier import load_verifier, reading
from trajforge.verification.result import KEYS, OUTPUT_CAP, VerifySettings, unverified


@pytest.mark.parametrize(
    ("output", "exit_code", "reward"),
    [
        ("checking\n0.75\n", 0, 0.75),
        ("0.25\n\n  \n", 1, 0.25),  # the number wins over the exit status; blank lines do not count
        ("-3e-1", 0, -0.3),
        ("all good\n", 0, 1.0),
        ("", 0, 1.0),
        ("broken\n", 2, 0.0),
        ("nan\n", 0, 1.0),  # not a finite number: the exit status decides
        ("inf\n", 3, 0.0),
        ("1 2\n", 0, 1.0),
    ],
)
def test_the_reward_is_the_last_line_when_a_number_else_the_exit_status(output, exit_code, reward):
    assert command_reward(output, exit_code) == reward


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("test -f out.txt", None),
        ({"command": "true", "final_contains": ["a"], "final_excludes": [], "tools_called": ["terminal"]}, None),
        ({"final_contains": ["done"]}, None),
        ("  ", "must be a non-empty command"),
        (5, "got int"),
        (["test -f x"], "got list"),
        (None, "got NoneType"),
        ({}, "needs at least one of"),
        ({"cmd": "true"}, "unknown check(s) 'cmd'"),
        ({"command": ""}, '"verify.command" must be a non-empty string'),
        ({"command": ["true"]}, '"verify.command" must be a non-empty string'),
        ({"final_contains": "done"}, '"verify.final_contains" must be a list of non-empty strings'),
        ({"tools_called": [1]}, '"verify.tools_called" must be a list'),
        ({"final_excludes": [""]}, '"verify.final_excludes" must be a list'),
    ],
)
def test_verify_specs(spec, problem):
    found = spec_problem(spec)
    assert found is None if problem is None else problem in found


def test_a_bad_verify_field_stops_the_run_naming_its_line(tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [{"prompt": "ok", "verify": "true"}, {"prompt": "a", "verify": 3}, {"prompt": "b", "verify": {"x": 1}}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    with pytest.raises(UsageError) as caught:
        load_dataset(path)
    message = str(caught.value)
    assert str(path) in message and "2 bad line(s)" in message
    assert 'line 2: "verify" must be a command' in message and 'line 3: "verify" has unknown check(s)' in message


def turns(final: str, *called: str) -> list[Turn]:
    calls = [ToolCall(f"c{i}", name, "{}", {"error": "failed"} if i else {}) for i, name in enumerate(called)]
    return [Turn("", "thinking", calls), Turn(final, "done")]


def object_check(spec: dict, conversation: list[Turn]) -> dict:
    """The object's gates need no environment."""
    return asyncio.run(check_object(spec, CheckContext({}, conversation, None, VerifySettings()), time.monotonic()))  # type: ignore[arg-type]


def test_object_checks_look_at_the_last_answer_and_the_tools_called():
    spec = {"final_contains": ["42", "Answer"], "final_excludes": ["sorry"], "tools_called": ["terminal", "patch"]}
    held = object_check(spec, turns("Answer: 42", "terminal", "patch"))  # a failed call was still made
    assert (held["passed"], held["reward"], held["output"]) == (True, 1.0, "every check holds")
    failed = object_check(spec, turns("answer: 42; sorry", "terminal"))
    assert (failed["passed"], failed["reward"]) == (False, 0.0)
    assert failed["output"].splitlines() == [
        "final answer lacks 'Answer'",  # case-sensitive
        "final answer contains 'sorry'",
        "tool 'patch' was not called",
    ]
    assert object_check({"final_contains": ["x"]}, [])["output"] == "final answer lacks 'x'"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.7, (0.7, True, "")),
        (0, (0.0, False, "")),
        ({"reward": 0.2, "passed": True, "info": "lenient"}, (0.2, True, "lenient")),
        ({"reward": 0.9, "info": {"checked": 3}}, (0.9, True, '{"checked": 3}')),
        ({"reward": 1, "passed": False}, (1.0, False, "")),
    ],
)
def test_what_a_python_verifier_may_return(value, expected):
    assert reading(value, 0.5) == expected


@pytest.mark.parametrize(
    "value", [True, None, "0.9", float("nan"), float("inf"), [1.0], {"passed": True}, {"reward": 1, "passed": "yes"}]
)
def test_anything_else_is_garbage(value):
    with pytest.raises(ValueError):
        reading(value, 0.5)


# -- in a real environment ----------------------------------------------------------------------


def run_in_env(tmp_path, settings: VerifySettings, entry: dict, prepare: str = "", final: str = "", **env_changes):
    """Verify one sample in a fresh local environment after running `prepare` there (the agent's work)."""
    env_settings = EnvironmentSettings(kind="local", run_dir=str(tmp_path), **env_changes)

    async def body():
        env = await backend_for(env_settings).open(entry)
        try:
            if prepare:
                await env.exec(prepare)
            record = {"prompt_index": 0, "metadata": {"source": entry}}
            return await verify_sample(settings, entry, lambda: record, turns(final, "terminal"), env)
        finally:
            await env.close()

    return asyncio.run(body())


def test_an_unverified_sample_has_the_same_keys_and_types_with_placeholders(tmp_path):
    found = run_in_env(tmp_path, VerifySettings(), {"prompt": "p"})
    assert (
        found
        == unverified()
        == {
            "verified": False,
            "passed": False,
            "reward": 0.0,
            "output": "",
            "duration_seconds": 0.0,
            "error": "",
            "replay_diverged": False,
        }
    )
    assert tuple(found) == KEYS


def test_a_verify_command_inspects_what_the_agent_wrote(tmp_path):
    entry = {"prompt": "p", "verify": 'grep -c 42 answer.txt; test "$(cat answer.txt)" = 42'}
    solved = run_in_env(tmp_path, VerifySettings(), entry, "echo 42 > answer.txt")
    assert solved["passed"] is True and solved["reward"] == 1.0 and solved["output"] == "1\n"
    assert solved["verified"] is True and solved["error"] == "" and solved["duration_seconds"] >= 0
    unsolved = run_in_env(tmp_path, VerifySettings(), entry, "echo 41 > answer.txt")
    assert unsolved["passed"] is False and unsolved["reward"] == 0.0


def test_a_printed_reward_against_the_threshold(tmp_path):
    entry = {"prompt": "p", "verify": "echo 0.6"}
    assert run_in_env(tmp_path, VerifySettings(threshold=0.5), entry)["passed"] is True
    below = run_in_env(tmp_path, VerifySettings(threshold=0.7), entry)
    assert below["passed"] is False and below["reward"] == 0.6
    failing = run_in_env(tmp_path, VerifySettings(), {"prompt": "p", "verify": "echo 0.9; exit 1"})
    assert failing["passed"] is False and failing["reward"] == 0.9  # passing needs exit 0 too


def test_a_verify_command_has_its_own_time_limit(tmp_path):
    started = time.monotonic()
    slow = run_in_env(tmp_path, VerifySettings(timeout=0.5), {"prompt": "p", "verify": "echo start; sleep 30"})
    assert time.monotonic() - started < 10
    assert slow["passed"] is False and slow["error"] == "verify command timed out after 0.5s"
    assert slow["output"] == "start\n"
    # --command_timeout bounds the model's commands, not the verification.
    patient = run_in_env(
        tmp_path, VerifySettings(timeout=10), {"prompt": "p", "verify": "sleep 1.2"}, command_timeout=1
    )
    assert patient["passed"] is True


def test_object_checks_and_command_together(tmp_path):
    spec = {"command": "test -f out.txt", "final_contains": ["done"]}
    both = run_in_env(tmp_path, VerifySettings(), {"prompt": "p", "verify": spec}, "touch out.txt", final="done")
    assert both["passed"] is True and both["reward"] == 1.0
    answer_wrong = run_in_env(tmp_path, VerifySettings(), {"prompt": "p", "verify": spec}, "touch out.txt", "nope")
    assert answer_wrong == answer_wrong | {"passed": False, "reward": 0.0, "output": "final answer lacks 'done'"}
    checks_only = run_in_env(tmp_path, VerifySettings(), {"prompt": "p", "verify": {"tools_called": ["terminal"]}})
    assert checks_only["passed"] is True and checks_only["reward"] == 1.0


def test_long_output_is_capped(tmp_path):
    done = run_in_env(tmp_path, VerifySettings(), {"prompt": "p", "verify": "head -c 100000 /dev/zero | tr '\\0' x"})
    assert len(done["output"]) == OUTPUT_CAP and done["output"].endswith("[... output cut ...]")


VERIFIERS = """
import time

def reads_the_answer(record, env):
    text = env.read_file("answer.txt").strip()
    listing = env.exec("ls", timeout=5)
    return {"reward": 1.0 if text == "42" else 0.0, "info": {"answer": text, "files": listing.output.split()}}

def missing_file(record, env):
    try:
        env.read_file("nowhere.txt")
    except FileNotFoundError as exc:
        return {"reward": 0.0, "info": str(exc)}

def sees_the_record(record, env):
    print("checking prompt", record["prompt_index"])
    return 0.5

def raises(record, env):
    raise RuntimeError("the grader broke")

def hangs(record, env):
    while True:
        time.sleep(0.1)

def garbage(record, env):
    return "looks fine to me"

def unsendable(record, env):
    return lambda: 1

def exits(record, env):
    raise SystemExit(3)
"""


@pytest.fixture
def verifiers(tmp_path):
    path = tmp_path / "my_verifiers.py"
    path.write_text(VERIFIERS)
    return lambda name, **changes: VerifySettings(verifier=verifier_spec(f"{path}:{name}", "verifier"), **changes)


def test_a_python_verifier_reads_files_and_runs_commands_through_the_handle(tmp_path, verifiers):
    done = run_in_env(tmp_path, verifiers("reads_the_answer"), {"prompt": "p"}, "echo 42 > answer.txt")
    assert done["passed"] is True and done["reward"] == 1.0 and done["error"] == ""
    assert json.loads(done["output"]) == {"answer": "42", "files": ["answer.txt"]}
    wrong = run_in_env(tmp_path, verifiers("reads_the_answer"), {"prompt": "p"}, "echo 7 > answer.txt")
    assert wrong["passed"] is False and wrong["reward"] == 0.0
    missing = run_in_env(tmp_path, verifiers("missing_file"), {"prompt": "p"})
    assert missing["passed"] is False and "cannot read nowhere.txt: no such file" in missing["output"]


def test_a_python_verifier_wins_over_the_verify_field_and_its_prints_are_kept(tmp_path, verifiers):
    done = run_in_env(tmp_path, verifiers("sees_the_record"), {"prompt": "p", "verify": "exit 1"})
    assert done["passed"] is True and done["reward"] == 0.5 and done["output"] == "checking prompt 0\n"


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("raises", "verifier raised RuntimeError: the grader broke"),
        ("garbage", "verifier returned 'looks fine to me'; return a finite number"),
        ("unsendable", "verifier returned function, which cannot be sent back"),
        ("exits", "verifier raised SystemExit: 3"),
    ],
)
def test_a_broken_python_verifier_fails_the_sample_with_its_error(tmp_path, verifiers, name, error):
    done = run_in_env(tmp_path, verifiers(name), {"prompt": "p"})
    assert done["passed"] is False and done["reward"] == 0.0 and error in done["error"]


def test_a_hanging_python_verifier_is_killed_at_the_verify_timeout(tmp_path, verifiers):
    started = time.monotonic()
    done = run_in_env(tmp_path, verifiers("hangs", timeout=1), {"prompt": "p"})
    assert time.monotonic() - started < 5
    assert done["passed"] is False and done["error"] == "verifier timed out after 1s"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon.py", "--verifier must be path/to/file.py:function or module:function"),
        ("{tmp}/absent.py:check", "absent.py does not exist"),
        ("{tmp}/my_verifiers.py:nothing_here", "has no function 'nothing_here'"),
        ("{tmp}/broken.py:check", "cannot be loaded (SyntaxError"),
        ("{tmp}/my_verifiers.py:time", "has no function 'time'"),  # a module is not callable
        ("no_such_module_xyz:check", "no_such_module_xyz cannot be loaded (ModuleNotFoundError"),
        ("json:dumps", "dumps must take two arguments, (record, env)"),
    ],
)
def test_a_verifier_that_cannot_be_used_is_refused_at_start(tmp_path, verifiers, spec, message):
    (tmp_path / "broken.py").write_text("def check(record, env):\n    return (\n")
    with pytest.raises((UsageError, FlagError)) as caught:
        load_verifier(verifier_spec(spec.format(tmp=tmp_path), "verifier"))
    assert message in str(caught.value)


def test_module_verifiers_load_by_name():
    assert load_verifier(verifier_spec("operator:add", "verifier"))(1, 2) == 3


def test_run_json_keeps_the_verifier_with_its_file_made_absolute(tmp_path, monkeypatch):
    # A resume from another folder must find the file, and a relative spec for it must agree.
    (tmp_path / "v.py").write_text("def check(record, env):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    row = next(row for row in RUN_SETTINGS if row.name == "verifier")
    kept = row.normal("v.py:check")
    assert kept == f"{(tmp_path / 'v.py').resolve()}:check" == row.normal("./v.py:check")
    assert row.normal("json:loads") == "json:loads" and row.normal(None) is None
