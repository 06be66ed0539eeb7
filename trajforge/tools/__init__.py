"""Tools: what the model can call. A tool is an async function ``(session, **arguments) -> dict``
whose first parameter is the prompt's ToolSession (tools/session.py: the environment as
``session.env``, and what some tools need besides); its JSON schema comes from its signature and
docstring (schema.py). Which tools exist, by toolset, is one table in registry.py.

Errors come back to the model as ``{"error": ...}`` and count as failures; a tool never raises into the
agent loop, except the run's budget stop (money/errors.py), which ends the prompt unfinished.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from trajforge import safejson
from trajforge.money.errors import SpendStop
from trajforge.own_tools import RESULT_LIMIT
from trajforge.tail import capped
from trajforge.tools.schema import tool_schema


@dataclass(frozen=True)
class Tool:
    name: str
    toolset: str
    function: Callable[..., Awaitable[dict]]
    schema: dict  # OpenAI tool object: {"type": "function", "function": {name, description, parameters}}
    signature: inspect.Signature  # to check a call's arguments before running it

    @classmethod
    def of(cls, toolset: str, function: Callable[..., Awaitable[dict]]) -> Tool:
        # A tool whose schema is given (an MCP server's) has it as `tool_schema`.
        schema = getattr(function, "tool_schema", None) or tool_schema(function)
        return cls(function.__name__, toolset, function, schema, inspect.signature(function))


async def call_tool(session, name: str, raw_arguments: str, offered: dict[str, Tool]) -> dict:
    """Run one tool call from the model; every problem becomes an ``{"error": ...}`` result."""
    chosen = offered.get(name)
    if chosen is None:
        return {"error": f"unknown tool {name!r}; the tools you can call are: {', '.join(sorted(offered))}"}
    try:
        arguments = safejson.parse(raw_arguments or "{}")  # the run's nesting limit; no lone surrogate
    except ValueError as exc:
        return {"error": f"the arguments of {name} are not valid JSON ({exc}); send a JSON object"}
    if not isinstance(arguments, dict):
        return {"error": f"the arguments of {name} must be a JSON object, got {type(arguments).__name__}"}
    try:
        chosen.signature.bind(session, **arguments)
    except TypeError as exc:
        return {"error": f"bad arguments for {name}: {exc}"}
    try:
        return await chosen.function(session, **arguments)
    except SpendStop:  # the budget stops the prompt itself, not just this call
        raise
    except Exception as exc:  # its message bounded as a result is (a --tools function's may be of any size)
        return {"error": capped(f"{type(exc).__name__}: {exc}", RESULT_LIMIT)}
