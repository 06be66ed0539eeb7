"""What a run can be extended with, by name: toolsets, toolset distributions, environment backends, export
formats and verifier kinds. The built-ins register here the way a plugin does (trajforge/builtin.py), and
trajforge/plugins.py loads the plugins (an entry point group, --plugins) before any flag is read, so
--distribution, --environment and --export accept their names and a dataset's `verify` their checks.

A plugin is a module or a .py file with a function `register(registry)`, `registry` being this module:

    def register(registry):
        registry.toolset("tickets", [open_ticket, close_ticket])      # async (session, **arguments) -> dict
        registry.distribution("support", {"tickets": 100, "terminal": 50})
        registry.backend("firecracker", FirecrackerBackend)         # an environments.contract.Backend
        registry.export("chatml", "chatml.jsonl", writer, row)        # writer(path, run); row(sample, run)
        registry.verifier("regex", check, problem)                    # a `verify` object's key

What is registered may be given as itself or as "module:attribute", imported on first use (the built-ins
import nothing at start). A name registered twice by different origins is a RegistryError naming both.
This module imports nothing of the package: every layer may read it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

BUILT_IN = "built-in"


class RegistryError(Exception):
    """A plugin that cannot be registered: a clash, a bad value. The command line makes it exit 2."""


@dataclass
class Entry:
    name: str
    origin: str  # who registered it: "built-in", an entry point, a plugin's module or file
    target: Any  # what was registered, or "module:attribute" until first used
    info: dict = field(default_factory=dict)  # what a caller needs without importing it (an export's file)

    def load(self) -> Any:
        self.target = resolve(self.target)
        return self.target


def resolve(target: Any) -> Any:
    """`target` itself, or what "module:attribute" names."""
    if not (isinstance(target, str) and ":" in target):
        return target
    module, _, attribute = target.partition(":")
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


class Table:
    """The registered things of one kind, in the order they were registered."""

    def __init__(self, kind: str):
        self.kind = kind
        self.entries: dict[str, Entry] = {}
        self.changes = 0  # counts every add and clear: what is built from the table is built again

    def add(self, name: str, target: Any, **info: Any) -> None:
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise RegistryError(f"{_origin}: a {self.kind} needs a name (a non-empty string), got {name!r}")
        known = self.entries.get(name)
        if known is not None and known.origin != _origin:
            raise RegistryError(f"{self.kind} {name!r} is registered by both {known.origin} and {_origin}")
        self.entries[name] = Entry(name, _origin, target, info)
        self.changes += 1

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __getitem__(self, name: str) -> Any:
        return self.entries[name].load()

    def entry(self, name: str) -> Entry:
        return self.entries[name]

    def clear(self) -> None:
        self.entries.clear()
        self.changes += 1


TOOLSETS = Table("toolset")  # name -> its tool functions, in the order the model sees them; info: check
DISTRIBUTIONS = Table("distribution")  # name -> {toolset: percent}
BACKENDS = Table("environment backend")  # name -> its Backend class
EXPORTS = Table("export format")  # name -> Export; info: file
VERIFIERS = Table("verifier kind")  # a `verify` object's key -> VerifierKind
TABLES = (TOOLSETS, DISTRIBUTIONS, BACKENDS, EXPORTS, VERIFIERS)

_origin = BUILT_IN


@contextmanager
def registering_as(origin: str) -> Iterator[None]:
    """What is registered inside is `origin`'s (the loader's; plugins do not call it)."""
    global _origin
    before, _origin = _origin, origin
    try:
        yield
    finally:
        _origin = before


# -- what a plugin calls ------------------------------------------------------------------------------------


def toolset(name: str, tools: Any, check: Any = None) -> None:
    """`tools`: the toolset's functions, `async (session, **arguments) -> dict` each, their schemas from
    their signatures and docstrings. `check(tool_settings) -> {tool or toolset name: why not}`, optional,
    runs once at start: what it names is not offered."""
    if not isinstance(tools, str):
        tools = tuple(tools)
        if not tools or not all(callable(tool) for tool in tools):
            raise RegistryError(f"{_origin}: toolset {name!r} needs a non-empty list of functions")
    TOOLSETS.add(name, tools, check=check)


def distribution(name: str, weights: dict[str, float]) -> None:
    """Each toolset switched on independently with its probability, in percent (0-100)."""
    if not isinstance(weights, dict) or not weights:
        raise RegistryError(f"{_origin}: distribution {name!r} needs a non-empty {{toolset: percent}} mapping")
    for toolset_name, percent in weights.items():
        if not isinstance(percent, (int, float)) or isinstance(percent, bool) or not 0 <= percent <= 100:
            raise RegistryError(f"{_origin}: distribution {name!r}: {toolset_name!r} needs a percent 0-100")
    DISTRIBUTIONS.add(name, dict(weights))


def backend(name: str, backend_class: Any) -> None:
    """An environments.contract.Backend subclass (its LIMITS says which limits it enforces)."""
    BACKENDS.add(name, backend_class)


@dataclass(frozen=True)
class Export:
    """An export format: `writer(path, run)` opens its file (write(row), commit(), abort()); `row(sample, run)`
    is what it writes for one journal Sample; `run` is export.formats.ExportRun (the formats written
    together, the run's name, the runner's version)."""

    writer: Callable[[Any, Any], Any]
    row: Callable[[Any, Any], Any]


def export(name: str, file: str, writer: Any, row: Any = None) -> None:
    """`file`: its name under the run folder's export/; `writer` and `row` as Export says (or `writer` alone:
    "module:attribute" of an Export)."""
    if not isinstance(file, str) or not file or "/" in file or file.startswith("."):
        raise RegistryError(f"{_origin}: export {name!r} needs a plain file name, got {file!r}")
    if not isinstance(writer, str) and not (callable(writer) and callable(row)):
        raise RegistryError(f"{_origin}: export {name!r} needs a writer and a row function")
    for other in EXPORTS.entries.values():
        if other.info["file"] == file and other.name != name:
            raise RegistryError(
                f"export {name!r} ({_origin}) would write {file}, as {other.name!r} ({other.origin}) does"
            )
    EXPORTS.add(name, writer if isinstance(writer, str) else Export(writer, row), file=file)


@dataclass(frozen=True)
class Verdict:
    """What one check of a `verify` object says of a sample. A gate (final_contains, ...) only lets the
    sample pass or not; a check that measures (a command, a judge) gives the reward too."""

    passed: bool
    output: str = ""
    reward: float | None = None  # None: a gate
    error: str = ""  # the check itself broke (a timeout): the sample does not pass, the error is recorded


def _any_value(value: Any) -> str | None:
    return None


@dataclass(frozen=True)
class VerifierKind:
    """A key of a dataset's `verify` object. `check(value, context) -> Verdict` (may be async) checks a
    finished sample; `context` is verification.kinds.CheckContext (the entry, turns, environment,
    settings). `problem(value) -> str | None` says at load why a value cannot be used."""

    check: Callable[..., Any]
    problem: Callable[[Any], str | None] = _any_value
    gate: bool = False  # checked before every measuring check, which runs only when all gates hold


def verifier(name: str, check: Any, problem: Any = None, gate: bool = False) -> None:
    """`check(value, context)`, sync or async, returns a Verdict, or a bool (passed, reward 1 or 0), or a
    number (the reward; passed at --pass_threshold). What it raises is a verification error of the sample."""
    if isinstance(check, str):  # "module:attribute" of a VerifierKind
        VERIFIERS.add(name, check)
    elif not callable(check) or (problem is not None and not callable(problem)):
        raise RegistryError(f"{_origin}: verifier kind {name!r} needs a check function (and a problem function)")
    else:
        VERIFIERS.add(name, VerifierKind(check, problem or _any_value, gate))
