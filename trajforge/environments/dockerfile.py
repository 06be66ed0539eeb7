"""A task folder's Dockerfile read as the engine reads it: its instructions, each with the line it starts
on (continuation lines joined, comments skipped, keywords in any case, the `# escape=` directive honoured),
and what the runner refuses in them at load.

The engine fetches an `ADD` URL or git repository itself, outside the build's `network_mode="none"`: from
the daemon's network, which reaches the host's loopback (a service there, the model endpoint). So an ADD
from a URL or git is refused; the file belongs in environment/, copied with COPY."""

from __future__ import annotations

import json
import re

DIRECTIVE = re.compile(r"#\s*([a-zA-Z]+)\s*=\s*(\S*)\s*$")
FLAGS = re.compile(r"^(?:--\S+\s+)*")  # ADD --chown=... --chmod=... --checksum=... before its sources
REMOTE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://|git@|github\.com/)")  # what the engine fetches itself


def instructions(dockerfile: str) -> list[tuple[int, str, str]]:
    """(line number, KEYWORD, its arguments) of each instruction."""
    lines = dockerfile.splitlines()
    escape = "\\"
    for line in lines:  # parser directives: only at the very top
        directive = DIRECTIVE.match(line.strip())
        if not directive:
            break
        if directive.group(1).lower() == "escape" and directive.group(2) in ("\\", "`"):
            escape = directive.group(2)
    found: list[tuple[int, str, str]] = []
    start, joined = 0, None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):  # blank and comment lines, inside a continuation too
            continue
        if joined is None:
            start, joined = number, ""
        if stripped.endswith(escape):
            joined += stripped[: -len(escape)] + " "
            continue
        found.append(_instruction(start, joined + stripped))
        joined = None
    if joined is not None:
        found.append(_instruction(start, joined))
    return found


def _instruction(number: int, text: str) -> tuple[int, str, str]:
    keyword, _, arguments = text.strip().partition(" ")
    return number, keyword.upper(), arguments.strip()


def sources(arguments: str) -> list[str]:
    """The sources of a COPY or ADD (its flags left out; the last word is the destination)."""
    rest = FLAGS.sub("", arguments)
    words: list[str] = []
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
            words = [str(word) for word in parsed] if isinstance(parsed, list) else []
        except ValueError:
            words = []
    if not words:
        words = rest.split()
    return words[:-1] or words


def fetch_problem(dockerfile: str) -> str | None:
    """Why the Dockerfile cannot be built here (an ADD the engine would fetch from the network), or None."""
    for number, keyword, arguments in instructions(dockerfile):
        if keyword == "ONBUILD":  # runs in a build FROM this image: refused as well
            _, keyword, arguments = _instruction(number, arguments)
        if keyword != "ADD":
            continue
        for source in sources(arguments):
            if REMOTE.match(source):
                return (
                    f"environment/Dockerfile line {number}: ADD {source}: the Docker engine fetches a URL or git "
                    "source itself, outside the build's network isolation; put the file in environment/ and COPY it"
                )
    return None


def images(dockerfile: str) -> list[str]:
    """The images a build needs from the engine: what FROM and COPY --from name, but its own stages (by
    name or number) and `scratch`."""
    found: list[str] = []
    stages: set[str] = {"scratch"}
    built = 0  # FROM lines so far: a later stage may name one by its number
    for _, keyword, arguments in instructions(dockerfile):
        if keyword == "FROM":
            words = FLAGS.sub("", arguments).split() or [""]
            named, alias = words[0], words[2].lower() if len(words) >= 3 and words[1].lower() == "as" else ""
        elif keyword == "COPY" and (source := re.search(r"--from=(\S+)", arguments)):
            named, alias = source.group(1), ""
        else:
            continue
        if named and named.lower() not in stages and named not in found:
            found.append(named)
        if keyword == "FROM":
            stages |= {alias, str(built)}
            built += 1
    return found
