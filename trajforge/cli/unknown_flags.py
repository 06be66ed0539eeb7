"""Refuse command-line arguments that Fire would not hand to the CLI function.

Fire binds the flags it knows and leaves the others for the function's return value, which
batch_runner's main() never returns (it exits), so a misspelled flag would be ignored and the run go
ahead without it. This reads argv the way Fire's keyword parser does (fire/core.py, _ParseKeywordArgs)
and names the first argument it would leave over.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection

HELP = ("-h", "--help")


def _is_flag(argument: str) -> bool:
    # Fire's test: "--anything", "-x", "-x=..." or "-xyz"; "-1" is a value (a negative number).
    return argument.startswith("--") or re.match(r"^-[a-zA-Z]", argument) is not None


def unknown_argument(argv: list[str], known: Collection[str]) -> str | None:
    """Why `argv` holds an argument that is none of the flags `known` (the function's parameter
    names), or None. Accepts every spelling Fire does: --flag=value, --flag value, --flag and --noflag
    (booleans), hyphens for underscores, a unique first letter (-o), -h/--help; and leaves the
    arguments after a lone "--" (Fire's own flags) to Fire."""
    if "--" in argv:
        argv = argv[: len(argv) - 1 - argv[::-1].index("--")]
    index = 0
    while index < len(argv):
        argument = argv[index]
        index += 1
        if argument in HELP:
            continue
        if not _is_flag(argument):
            return f"unexpected argument {argument!r}; every setting is a flag such as --run_name=NAME (see --help)"
        written, equals, _ = argument.partition("=")
        key = written.lstrip("-").replace("-", "_")
        bare = not equals and (index == len(argv) or _is_flag(argv[index]))
        if len(key) == 1:
            matches = [name for name in known if name.startswith(key)]
            if len(matches) > 1:
                return f"{written} could be any of {', '.join('--' + name for name in matches)}; spell the flag out"
            found = bool(matches)
        else:
            found = key in known or (bare and key.startswith("no") and key[2:] in known)
        if not found:
            return f"unknown flag {written}; " + _suggestion(key, known)
        if not equals and not bare:
            index += 1  # "--flag value": the next argument is its value
    return None


def _suggestion(key: str, known: Collection[str]) -> str:
    closest = difflib.get_close_matches(key, list(known), n=1)
    return f"did you mean --{closest[0]}?" if closest else "see --help for the flags"
