"""The one command that continues a run, printed by every exit that can be continued (failed prompts,
Ctrl-C, a refused key, the budget): the command line that ran, with --resume and what must change,
shell-quoted so that it works pasted. A secret given on the command line is left out, never shown."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable

SECRETS = {
    "api_key": "pass --api_key again or set OPENROUTER_API_KEY (or OPENAI_API_KEY)",
    "ephemeral_system_prompt": "pass --ephemeral_system_prompt again (it is never saved)",
}


def continue_command(argv: list[str], changes: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """(the command line `argv` again with --resume and `changes` (flag -> value) set, what the user
    must add: one note per secret left out)."""
    changes = changes or {}
    program = [sys.executable, argv[0]] if argv[0].endswith(".py") else [os.path.basename(argv[0])]
    dropped = {"resume", *changes}
    kept, notes = [], []
    for name, written in _flags(argv[1:]):
        if name in SECRETS:
            notes.append(SECRETS[name])
        elif name not in dropped and not (name.startswith("no") and name[2:] in dropped):
            kept.extend(written)
    parts = [*program, *kept, "--resume", *(f"--{name}={value}" for name, value in changes.items())]
    return shlex.join(parts), list(dict.fromkeys(notes))


def _flags(arguments: list[str]) -> Iterable[tuple[str, list[str]]]:
    """(flag name, its arguments as written) of a command line: --flag=value, --flag value, --flag."""
    index = 0
    while index < len(arguments):
        written = [arguments[index]]
        index += 1
        head = written[0]
        if "=" not in head and index < len(arguments) and not arguments[index].startswith("-"):
            written.append(arguments[index])
            index += 1
        yield head.lstrip("-").partition("=")[0].replace("-", "_"), written
