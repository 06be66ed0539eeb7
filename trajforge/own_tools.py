"""--tools: a user's Python file or module as a toolset, named after it, of every public function it
defines (not those it imports). A function whose first parameter is `session` gets the sample's tool
session (`session.env`: run commands in the sample's sandbox, read and write its files) and must be async,
since the session's methods are awaited; any other function, sync or async, is a function of its arguments
alone (a sync one runs in a thread, so that it holds up no other sample of the worker). A tool's schema
comes from the signature and docstring as the built-in tools' do (tools/schema.py).

What a function returns is the tool's result: a dict as it is, anything else as {"result": value}; one
of more than RESULT_LIMIT bytes as JSON is its JSON text, capped (head and tail kept, with a marker). A
value that is not JSON, or what the function raises, is a tool error (a failure in tool_stats).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trajforge import safejson
from trajforge.errors import UsageError
from trajforge.tail import capped

SESSION = "session"
RESULT_LIMIT = 100_000  # bytes the model reads of a result of the user's own tools (--tools, an MCP server's)


def register(module: ModuleType, toolset: str, where: str, registry: Any) -> None:
    """Register `module`'s public functions as the toolset `toolset`; UsageError naming `where` when it
    defines none, or a function that cannot be a tool."""
    functions = [
        value
        for name, value in vars(module).items()
        if not name.startswith("_") and inspect.isfunction(value) and value.__module__ == module.__name__
    ]
    if not functions:
        raise UsageError(f"{where}: defines no public function (each public function it defines is a tool)")
    registry.toolset(toolset, [as_tool(function, where) for function in functions])


def as_tool(function: Callable, where: str) -> Callable:
    """`function` as a tool: `async (session, **arguments) -> dict`, with the same name, docstring, type
    hints and (but for the session) parameters."""
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    takes_session = bool(parameters) and parameters[0].name == SESSION
    is_async = inspect.iscoroutinefunction(function)
    if takes_session and not is_async:
        raise UsageError(
            f"{where}: {function.__name__} takes the session, so it must be `async def` (the session's "
            "environment is awaited: `await session.env.exec(...)`)"
        )

    async def tool(session: Any, **arguments: Any) -> dict:
        if takes_session:
            value = await function(session, **arguments)
        elif is_async:
            value = await function(**arguments)
        else:
            value = await asyncio.to_thread(function, **arguments)
        return result_of(function.__name__, value)

    functools.update_wrapper(tool, function)
    if not takes_session:  # the schema and the argument check skip a tool's first parameter: the session
        session = inspect.Parameter(SESSION, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        tool.__signature__ = signature.replace(parameters=[session, *parameters])  # type: ignore[attr-defined]
    return tool


def result_of(name: str, value: Any) -> dict:
    """What the model reads of a function's return value; TypeError for one that is no JSON value."""
    result = value if isinstance(value, dict) else {"result": value}
    result = safejson.writable(result)  # the run's nesting limit, lone surrogates escaped
    try:
        text = json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} returned {type(value).__name__}, which is not a JSON value ({exc})") from None
    return result if len(text) <= RESULT_LIMIT else {"result": capped(text, RESULT_LIMIT)}
