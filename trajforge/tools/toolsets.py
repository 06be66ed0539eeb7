"""The registered toolsets (trajforge/registry.py: the built-ins' and every plugin's) as Tools, with their
schemas built once per process, and which of them this run can offer.

A toolset's check, ``check(settings) -> {tool name, or the toolset's name: why it cannot be offered}``,
runs once at start, in the parent process, when the distribution (or --list_distributions) has the
toolset; what it names is left out of the tools offered to the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trajforge import registry
from trajforge.tools import Tool
from trajforge.tools.settings import ToolSettings

NOT_IMPLEMENTED = "not implemented in this version"
_built: dict[int, dict[str, list[Tool]]] = {}  # the tables' state -> every toolset's tools


def by_toolset() -> dict[str, list[Tool]]:
    """Every registered toolset's tools; RegistryError when two toolsets have a tool of the same name."""
    state = registry.TOOLSETS.changes
    if state not in _built:
        made = {
            name: [_tool(name, function) for function in registry.TOOLSETS[name]] for name in registry.TOOLSETS.names()
        }
        owner: dict[str, str] = {}
        for name, tools in made.items():
            for tool in tools:
                if tool.name in owner:
                    first, second = (registry.TOOLSETS.entry(n).origin for n in (owner[tool.name], name))
                    raise registry.RegistryError(
                        f"tool {tool.name!r} is in two toolsets: {owner[tool.name]!r} ({first}) and {name!r} ({second})"
                    )
                owner[tool.name] = name
        _built.clear()
        _built[state] = made
    return _built[state]


def _tool(toolset: str, function: Callable) -> Tool:
    """A registered function as a Tool; RegistryError naming it when its signature has no JSON schema."""
    try:
        return Tool.of(toolset, function)
    except Exception as exc:
        origin = registry.TOOLSETS.entry(toolset).origin
        name = getattr(function, "__name__", repr(function))
        raise registry.RegistryError(
            f"toolset {toolset!r} ({origin}): {name} cannot be a tool: {type(exc).__name__}: {exc} "
            "(parameters may be str, int, float, bool, dict, list[...] or X | None)"
        ) from None


def every_tool() -> dict[str, Tool]:
    """Every tool a run can offer, by name: the keys of tool_stats."""
    return {tool.name: tool for tools in by_toolset().values() for tool in tools}


@dataclass(frozen=True)
class Unavailable:
    toolset: str
    tool: str | None  # None: the whole toolset
    reason: str


def available_toolsets(
    settings: ToolSettings, wanted: Iterable[str]
) -> tuple[dict[str, list[Tool]], list[Unavailable]]:
    """The tools this run can offer, per toolset of `wanted`, and what it cannot offer and why."""
    every = by_toolset()
    offered: dict[str, list[Tool]] = {}
    missing: list[Unavailable] = []
    for name in dict.fromkeys(wanted):
        if name not in every:
            missing.append(Unavailable(name, None, NOT_IMPLEMENTED))
            continue
        check = registry.resolve(registry.TOOLSETS.entry(name).info.get("check"))
        problems = check(settings) if check else {}
        if name in problems:  # the toolset's own name: none of its tools can be offered
            missing.append(Unavailable(name, None, problems[name]))
            continue
        missing += [Unavailable(name, tool_name, why) for tool_name, why in problems.items()]
        offered[name] = [t for t in every[name] if t.name not in problems]
    return offered, missing
