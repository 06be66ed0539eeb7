"""The one flag table (trajforge/flags): main's signature, run.json's rows, every default, --help,
--version and docs/flags.md come from it or are checked against it here."""

from __future__ import annotations

import dataclasses
import inspect
import os
import pty
import re
import subprocess
import sys

from conftest import ROOT

import batch_runner
from trajforge.agent.loop import run_agent
from trajforge.cli.config import RUN_SETTINGS
from trajforge.cli.flagtext import reference, signature
from trajforge.environments import EnvironmentSettings
from trajforge.flags import FLAGS, GROUPS, OPENROUTER, PER_INVOCATION
from trajforge.model.settings import ModelSettings
from trajforge.runconfig import RunConfig
from trajforge.verification.result import VerifySettings

HELP_LINE = re.compile(r"^  --(\w+)(=\w+)? +(.+); (default .+|required.*?)( \[kept\])?$")


def test_mains_signature_is_the_tables():
    parameters = inspect.signature(batch_runner.main).parameters
    assert list(parameters) == [flag.name for flag in FLAGS] and inspect.signature(batch_runner.main) == signature()
    for flag in FLAGS:
        expected = None if flag.kept else flag.default  # a kept flag must be told apart from "not given"
        assert parameters[flag.name].default == expected, flag.name
        assert parameters[flag.name].kind is inspect.Parameter.KEYWORD_ONLY


def test_run_json_keeps_exactly_the_kept_flags_with_the_tables_defaults():
    assert [row.name for row in RUN_SETTINGS] == [flag.name for flag in FLAGS if flag.kept]
    for row in RUN_SETTINGS:
        assert row.may_change == (row.resume == "may change")


def test_every_default_is_the_tables():
    """A default written twice drifts (max_tool_calls_per_turn's 32 once lived in three places)."""
    by_name = {flag.name: flag for flag in FLAGS}
    for field in dataclasses.fields(RunConfig):
        if (
            field.name in by_name
            and field.default is not dataclasses.MISSING
            and by_name[field.name].default is not None
        ):
            assert field.default == by_name[field.name].default, field.name
    assert EnvironmentSettings.__dataclass_fields__["command_timeout"].default == by_name["command_timeout"].default
    assert VerifySettings.__dataclass_fields__["timeout"].default == by_name["verify_timeout"].default
    for name in ("request_timeout", "max_retries", "stream"):
        assert ModelSettings.__dataclass_fields__[name].default == by_name[name].default, name
    loop_default = inspect.signature(run_agent).parameters["max_tool_calls"].default
    assert loop_default == by_name["max_tool_calls_per_turn"].default


def test_the_committed_flag_reference_is_the_generated_one():
    committed = (ROOT / "docs" / "flags.md").read_text()
    assert committed == reference(), "run: python -m trajforge.cli.flagtext > docs/flags.md"
    for flag in FLAGS:
        assert f"`--{flag.name}`" in committed
    assert "| per invocation |" in committed and "| remembered |" in committed and "| may change |" in committed


def test_help_lists_every_flag_by_group_with_its_real_default_and_exits_0():
    proc = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    headers = [line[:-1] for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    assert headers == list(GROUPS)
    flag_lines = [line for line in lines if line.startswith("  --")]
    assert [HELP_LINE.match(line).group(1) for line in flag_lines] == [flag.name for flag in FLAGS]
    text = proc.stdout
    assert "default anthropic/claude-sonnet-4.6" in text and f"default {OPENROUTER}" in text
    assert "Default: None" not in text and "NAME" not in text.split("usage")[0]  # not Fire's page
    kept = {HELP_LINE.match(line).group(1) for line in flag_lines if line.endswith("[kept]")}
    assert kept == {flag.name for flag in FLAGS if flag.resume != PER_INVOCATION}


def test_help_on_a_terminal_opens_no_pager():
    """Fire pages its help through `less` on a terminal; on a pty without input that would wait."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, str(ROOT / "batch_runner.py"), "-h"])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b"samples and verification:" in out and b"(END)" not in out


def test_version_prints_the_version_and_the_commit_of_a_checkout():
    proc = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), "--version"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    assert re.fullmatch(r"batch_runner \d+\.\d+\.\d+\S* \(git [0-9a-f]{12}(-dirty)?\)\n", proc.stdout), proc.stdout
    assert head.stdout.strip() in proc.stdout
