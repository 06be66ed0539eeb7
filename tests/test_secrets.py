"""Secrets never reach a trajectory or a log: the API key (whether a command encodes it, a server echoes it
or a log line quotes it), the ephemeral system prompt and the prefill (whether the model quotes them)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import API_KEY, Result, Runner, calls, tool_results

from trajectory import ToolCall, Turn
from trajforge.secrets import Secrets

TOOLS = ["--distribution=terminal_only"]
EPHEMERAL = "EPHEMERAL-SYSTEM-TEXT: answer like a pirate"
PREFILL = [
    {"role": "user", "content": "What is six times seven, exactly?"},
    {"role": "assistant", "content": 'Line one of "the" example,\nand line two: forty-two.'},
    {"role": "user", "content": "ok"},  # under the minimum length: never masked
]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def encodings(secret: str) -> dict[str, bytes]:
    """The secret as a command could print it: plain, reversed, and base64 at each of the 3 byte
    alignments (only the characters that depend on the secret's bytes alone)."""
    raw = secret.encode()
    found = {"plain": raw, "reversed": raw[::-1]}
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).rstrip(b"=")
        start, end = -(-8 * offset // 6), 8 * (offset + len(raw)) // 6
        found[f"base64+{offset}"] = encoded[start:end]
    return found


def assert_nowhere(secret: str, *texts: str, folder: Path | None = None) -> None:
    """Neither `texts` nor any file under `folder` holds `secret` in any of its encodings, also where
    base64 output was wrapped onto several lines (a newline, or its JSON escape, in between)."""
    places = {f"text {i}": t.encode() for i, t in enumerate(texts)}
    if folder is not None:
        places |= {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert len(places) > len(texts) or folder is None, f"{folder} holds no file"
    for where, data in places.items():
        unwrapped = data.replace(b"\\n", b"").replace(b"\n", b"")
        for name, form in encodings(secret).items():
            assert form not in data and form not in unwrapped, f"{secret!r} ({name}) found in {where}"


def unique_key() -> str:
    # Other test runs on this machine show the shared test key in `ps`; this one is ours alone.
    return f"sk-or-v1-{secrets.token_hex(16)}"


def run_with_key(run: Runner, entries, *flags: str, key: str, via_environment: bool) -> Result:
    """batch_runner.py as a subprocess with `key` given as --api_key or in OPENROUTER_API_KEY."""
    command = [part for part in run.command(entries, *flags) if not part.startswith("--api_key=")]
    env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")}
    if via_environment:
        env["OPENROUTER_API_KEY"] = key
    else:
        command.append(f"--api_key={key}")
    proc = subprocess.run(command, cwd=run.tmp_path, capture_output=True, text=True, timeout=180, env=env)
    return Result(proc.returncode, proc.stdout, proc.stderr, run.tmp_path / "out" / "run")


def command_prompt(command: str) -> dict:
    return {"prompt": f"run it [mock command={command.replace(' ', '%20')}]"}


SNOOPING = [
    "base64 /proc/$PPID/cmdline",
    "rev /proc/$PPID/environ",
    "ps -eo args",
    "cat /proc/*/environ | tr '\\0' '\\n'",
    "for p in /proc/[0-9]*; do base64 -w0 $p/cmdline; rev $p/environ; done",
]


@needs_bwrap
@pytest.mark.parametrize("via_environment", [False, True], ids=["flag", "environment"])
def test_bwrap_commands_see_no_process_with_the_key(run, via_environment):
    key = unique_key()
    entries = [command_prompt(command) for command in SNOOPING]
    result = run_with_key(run, entries, *TOOLS, "--environment=bwrap", key=key, via_environment=via_environment)
    assert result.code == 0, result.stderr
    outputs = {r["prompt_index"]: tool_results(r) for r in result.trajectories}
    assert len(outputs) == len(SNOOPING)
    assert "PATH=" in outputs[3] and "ps -eo args" in outputs[2]  # the commands ran and saw something
    assert "[redacted]" not in "".join(outputs.values())  # nothing to mask: they never saw the key
    assert_nowhere(key, result.stdout, result.stderr, folder=result.run_dir)


@pytest.mark.parametrize("via_environment", [False, True], ids=["flag", "environment"])
def test_local_workers_show_no_key_in_proc(run, via_environment):
    # `local` cannot hide the runner's memory, but its command line and environment no longer hold the key.
    key = unique_key()
    # The runner's lines of ps only: the whole table of a busy machine passes the output's cap, whose middle is cut.
    ps = "ps -eo args | grep batch_runner.py | grep -v grep"
    entries = [command_prompt(f"base64 -w0 /proc/$PPID/cmdline; rev /proc/$PPID/environ; {ps}")]
    flags = (*TOOLS, "--environment=local", f"--ephemeral_system_prompt={EPHEMERAL}")
    result = run_with_key(run, entries, *flags, key=key, via_environment=via_environment)
    assert result.code == 0, result.stderr
    output = tool_results(result.trajectories[0])
    assert "batch_runner.py" in output  # ps shows the runner, its key overwritten in place
    assert_nowhere(key, output, result.stdout, result.stderr, folder=result.run_dir)
    assert_nowhere(EPHEMERAL, output, folder=result.run_dir)


def test_a_key_the_server_echoes_is_in_no_log_and_no_file(run_here):
    entries = [
        {"prompt": "retried [mock fail=500 times=1 retry_after=0 echo_key]"},
        {"prompt": "refused [mock fail=400 echo_key]"},
        {"prompt": "answered [mock turns=0 echo_key]"},
    ]
    result = run_here(entries, *TOOLS, "--verbose", "--max_retries=1", "--log_prefix_chars=500")
    assert result.code == 4, result.stderr  # the 400 fails its prompt, for good
    assert "retry 1/1" in result.stderr and "you sent Bearer [redacted]" in result.stderr
    (error,) = result.jsonl("errors.jsonl")
    assert error["error_type"] == "api_http_400" and "Bearer [redacted]" in error["message"]
    answers = [r["conversations"][-1]["value"] for r in result.trajectories]
    assert len(answers) == 2 and all("you sent Bearer [redacted]" in a for a in answers)
    redactions = result.statistics["redactions"]
    assert redactions["api_key"] >= 2 and (redactions["ephemeral_prompt"], redactions["prefill"]) == (0, 0)
    assert_nowhere(API_KEY, result.stdout, result.stderr, folder=result.run_dir)


def test_quoted_ephemeral_prompt_and_prefill_are_masked_and_counted(run_here, tmp_path):
    prefill = tmp_path / "prefill.json"
    prefill.write_text(json.dumps(PREFILL))
    entries = [{"prompt": "leaky [mock quote]"}, {"prompt": "plain"}]
    flags = (*TOOLS, f"--ephemeral_system_prompt={EPHEMERAL}", f"--prefill_messages_file={prefill}", "--verbose")
    result = run_here(entries, *flags)
    assert result.code == 0, result.stderr
    leaky, plain = sorted(result.trajectories, key=lambda r: r["prompt_index"])
    assert set(leaky) == set(plain) and set(leaky["metadata"]) == set(plain["metadata"])  # same keys on every row
    saved = json.dumps(leaky)
    assert "[ephemeral prompt]" in saved and "[prefill]" in saved
    assert leaky["conversations"][1]["value"] == "leaky [mock quote]"  # the prompt, byte for byte
    call = calls(leaky["conversations"][2])[0]
    assert "[prefill]" in json.loads(call["arguments"])["command"]  # masked in its JSON-escaped form too
    # Turn 1's reasoning and call, the command's output, turn 2's reasoning, turn 3's reasoning and answer.
    redactions = result.statistics["redactions"]
    assert redactions == {"api_key": 0, "ephemeral_prompt": 6, "prefill": 12}
    for text in (EPHEMERAL, PREFILL[0]["content"], PREFILL[1]["content"]):
        assert_nowhere(text, result.stdout, result.stderr, folder=result.run_dir)


def test_secrets_mask_exact_and_json_escaped_copies_and_count_them():
    hidden = Secrets(["sk-key-12345678", None], "be brief, always", ["ok", 'say "hi"\nthen stop'])
    counts: Counter = Counter()
    text = 'sk-key-12345678 | be brief, always | {"a": "say \\"hi\\"\\nthen stop"} | ok, broken'
    masked = hidden.redact(text, counts)
    assert masked == '[redacted] | [ephemeral prompt] | {"a": "[prefill]"} | ok, broken'
    assert counts == {"api_key": 1, "ephemeral_prompt": 1, "prefill": 1}
    # The longest first: a prefill that quotes the ephemeral prompt is masked whole.
    nested = Secrets([], "be brief, always", ["Remember: be brief, always."])
    assert nested.redact("Remember: be brief, always.") == "[prefill]"
    turn = Turn("sk-key-12345678", "", [ToolCall("id", "terminal", '{"c": "sk-key-12345678"}', {"out": "ok"})])
    hidden.redact_turns([turn], counts)
    assert (turn.content, turn.calls[0].arguments) == ("[redacted]", '{"c": "[redacted]"}')


def test_encodings_find_base64_at_every_alignment():
    for prefix in (b"", b"a", b"ab", b"abc"):
        printed = base64.b64encode(prefix + b"--api_key=" + API_KEY.encode() + b"\0x").decode()
        with pytest.raises(AssertionError):
            assert_nowhere(API_KEY, printed)
