"""The tool registry: tool name -> toolset, JSON schema and function.

A tool is an async function ``(env, **arguments) -> dict`` registered with ``@tool("toolset")``; its
schema is built from its signature and docstring. Errors come back to the model as ``{"error": ...}``
and count as failures; a tool never raises into the agent loop.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

TOOLSET_MODULES = ("terminal", "file")  # modules under tools/, each registering one toolset


@dataclass(frozen=True)
class Tool:
    name: str
    toolset: str
    function: Callable[..., Awaitable[dict]]
    schema: dict  # OpenAI tool object: {"type": "function", "function": {name, description, parameters}}


TOOLS: dict[str, Tool] = {}
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


def tool(toolset: str):
    """Register an async tool function under `toolset`."""

    def register(function: Callable[..., Awaitable[dict]]) -> Callable[..., Awaitable[dict]]:
        TOOLS[function.__name__] = Tool(function.__name__, toolset, function, _schema(function))
        return function

    return register


def _json_type(annotation) -> dict:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return {"type": "array", "items": _json_type(item)}
    return {"type": _JSON_TYPES[annotation]}


def _schema(function: Callable) -> dict:
    """JSON schema from the signature (types, defaults) and the docstring (text, ``Args:`` lines)."""
    doc = inspect.getdoc(function) or ""
    description, _, args_text = doc.partition("\nArgs:\n")
    arg_docs = dict(re.findall(r"^ {4}(\w+): (.+(?:\n {8,}.+)*)", args_text, re.M))
    hints = typing.get_type_hints(function)
    properties, required = {}, []
    for name, param in list(inspect.signature(function).parameters.items())[1:]:  # skip env
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
        importlib.import_module(f"tools.{module}")
    toolsets: dict[str, list[Tool]] = {}
    for item in TOOLS.values():
        toolsets.setdefault(item.toolset, []).append(item)
    return toolsets


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
        inspect.signature(chosen.function).bind(env, **arguments)
    except TypeError as exc:
        return {"error": f"bad arguments for {name}: {exc}"}
    try:
        return await chosen.function(env, **arguments)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
