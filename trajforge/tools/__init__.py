"""The tool registry: tool name -> toolset, JSON schema and function.

A tool is an async function ``(env, **arguments) -> dict`` registered with ``@tool("toolset")``; its
schema is built from its signature and docstring. Errors come back to the model as ``{"error": ...}``
and count as failures; a tool never raises into the agent loop. Its first argument is the prompt's
ToolSession (tools/session.py): the environment's four coroutines, plus what some tools need besides.

A toolset may register a ``@check`` that tells, once at start, which of its tools this machine or
configuration cannot offer; those are left out of the tools offered to the model.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

# Modules under tools/, each registering one toolset.
TOOLSET_MODULES = ("terminal", "file", "code_execution", "web", "vision", "image_gen", "browser")
NOT_IMPLEMENTED = "not implemented in this version"


@dataclass(frozen=True)
class Tool:
    name: str
    toolset: str
    function: Callable[..., Awaitable[dict]]
    schema: dict  # OpenAI tool object: {"type": "function", "function": {name, description, parameters}}
    signature: inspect.Signature  # to check a call's arguments before running it


@dataclass(frozen=True)
class Unavailable:
    toolset: str
    tool: str | None  # None: the whole toolset
    reason: str


TOOLS: dict[str, Tool] = {}
CHECKS: dict[str, Callable[..., dict[str, str]]] = {}  # toolset -> its check, see check()
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


def tool(toolset: str):
    """Register an async tool function under `toolset`."""

    def register(function: Callable[..., Awaitable[dict]]) -> Callable[..., Awaitable[dict]]:
        signature = inspect.signature(function)
        TOOLS[function.__name__] = Tool(function.__name__, toolset, function, _schema(function, signature), signature)
        return function

    return register


def check(toolset: str):
    """Register `function(settings) -> {tool name, or the toolset's name: why it cannot be offered}`,
    run once at start, in the parent process, when the distribution (or --list_distributions) has
    `toolset`."""

    def register(function: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
        CHECKS[toolset] = function
        return function

    return register


def _json_type(annotation) -> dict:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return {"type": "array", "items": _json_type(item)}
    return {"type": _JSON_TYPES[annotation]}


def _schema(function: Callable, signature: inspect.Signature) -> dict:
    """JSON schema from the signature (types, defaults) and the docstring (text, ``Args:`` lines)."""
    doc = inspect.getdoc(function) or ""
    description, _, args_text = doc.partition("\nArgs:\n")
    arg_docs = dict(re.findall(r"^ {4}(\w+): (.+(?:\n {8,}.+)*)", args_text, re.M))
    hints = typing.get_type_hints(function)
    properties, required = {}, []
    for name, param in list(signature.parameters.items())[1:]:  # skip env
        prop = _json_type(hints[name])
        if name in arg_docs:
            prop["description"] = " ".join(arg_docs[name].split())
        properties[name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": function.__name__, "description": " ".join(description.split()), "parameters": parameters},
    }


def load_toolsets() -> dict[str, list[Tool]]:
    """Import every toolset module; returns toolset -> its tools."""
    for module in TOOLSET_MODULES:
        importlib.import_module(f"trajforge.tools.{module}")
    toolsets: dict[str, list[Tool]] = {}
    for item in TOOLS.values():
        toolsets.setdefault(item.toolset, []).append(item)
    return toolsets


def available_toolsets(settings, wanted: Iterable[str]) -> tuple[dict[str, list[Tool]], list[Unavailable]]:
    """The tools this run can offer, per toolset of `wanted`, and what it cannot offer and why."""
    toolsets = load_toolsets()
    offered: dict[str, list[Tool]] = {}
    missing: list[Unavailable] = []
    for name in dict.fromkeys(wanted):
        if name not in toolsets:
            missing.append(Unavailable(name, None, NOT_IMPLEMENTED))
            continue
        problems = CHECKS[name](settings) if name in CHECKS else {}
        if name in problems:  # the toolset's own name: none of its tools can be offered
            missing.append(Unavailable(name, None, problems[name]))
            continue
        missing += [Unavailable(name, tool_name, why) for tool_name, why in problems.items()]
        offered[name] = [t for t in toolsets[name] if t.name not in problems]
    return offered, missing


async def call_tool(env, name: str, raw_arguments: str, offered: dict[str, Tool]) -> dict:
    """Run one tool call from the model; every problem becomes an ``{"error": ...}`` result."""
    chosen = offered.get(name)
    if chosen is None:
        return {"error": f"unknown tool {name!r}; the tools you can call are: {', '.join(sorted(offered))}"}
    try:
        arguments = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as exc:
        return {"error": f"the arguments of {name} are not valid JSON ({exc}); send a JSON object"}
    if not isinstance(arguments, dict):
        return {"error": f"the arguments of {name} must be a JSON object, got {type(arguments).__name__}"}
    try:
        chosen.signature.bind(env, **arguments)
    except TypeError as exc:
        return {"error": f"bad arguments for {name}: {exc}"}
    try:
        return await chosen.function(env, **arguments)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
