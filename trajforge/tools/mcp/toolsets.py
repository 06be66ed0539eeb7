"""MCP servers as toolsets: listed once at the run's start (a server that cannot start, or lists what the
run cannot offer, is exit 2 before any request), registered as a toolset each with the schemas that
listing gave (the keys of tool_stats; a Ray task registers them again from the run's settings, listing
nothing), and per sample: every server connected once the task is in place (a stdio server started in
the sample's sandbox), a session resource, so that it ends with the agent, before the clean room, and
asked for its tools again: what it lists then, with those schemas, is what the sample is offered of it
(a server may offer each sample its own tools); a listing the run cannot offer fails that sample.

What a server lists is bounded, at the start and per sample alike: MAX_PAGES pages of tools/list,
MAX_TOOLS tools, a schema of at most MAX_SCHEMA bytes and MAX_DEPTH levels. A result is its text content,
capped at RESULT_LIMIT bytes (head and tail kept, with a marker); other content is a note naming its kind
and size.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trajforge import registry, safejson
from trajforge.environments import Backend, EnvironmentSettings, backend_for
from trajforge.environments.contract import Environment
from trajforge.errors import SetupError, UsageError
from trajforge.own_tools import RESULT_LIMIT
from trajforge.secrets import Secrets
from trajforge.tail import capped
from trajforge.tools import Tool
from trajforge.tools.mcp.servers import Server
from trajforge.tools.toolsets import every_tool

if TYPE_CHECKING:  # the SDK and its types take a second or more to import: only runs with servers load them
    import mcp_types as types

    from trajforge.tools.mcp.connection import Connection

MAX_PAGES = 20
MAX_TOOLS = 256
MAX_SCHEMA = 64 << 10
MAX_DEPTH = 32
Listing = dict[str, list[dict]]  # server name -> the OpenAI tool objects it offers, as named to the model
# A stdio server starts in / with the sample's working folder in MCP_WORKSPACE: not in that folder, which
# the dataset's files and the agent write, where `python -m` looks for modules first (also the ones it
# imports later, once the agent has written there), npx for node_modules/.bin and uv for pyproject.toml.
# Its Python puts neither its working folder nor its script's folder on sys.path, nor HOME's site-packages
# (unless its env says otherwise: PYTHONSAFEPATH="" for a script importing modules beside it).
FROM_ROOT = ["sh", "-c", 'MCP_WORKSPACE=$(pwd) && export MCP_WORKSPACE && cd / && exec "$@"', "mcp-server"]
SERVER_VARIABLES = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}


async def connect(env: Environment | None, server: Server) -> Connection:
    """A started, initialized connection: a stdio server spawned in `env`, an HTTP server reached from here."""
    from trajforge.tools.mcp.connection import MESSAGE_LIMIT, Connection  # the SDK: only when a server is used

    if not server.stdio:
        return await Connection.http(server)
    assert env is not None
    variables = {**SERVER_VARIABLES, **server.env}
    try:
        spawned = await env.spawn([*FROM_ROOT, *server.command], variables, server.readable, MESSAGE_LIMIT)
    except (NotImplementedError, OSError) as exc:
        raise RuntimeError(f"{server} did not start: {exc}") from None
    return await Connection.stdio(server, spawned)


async def listing(servers: tuple[Server, ...], backend: Backend) -> Listing:
    """What each server offers, asked once at the run's start (a stdio server in an environment of the run's
    backend, as a sample's); UsageError naming the server when it cannot start or lists what cannot be offered."""
    found: Listing = {}
    for server in servers:
        env = await backend.open({}, f"mcp-{server.name}") if server.stdio else None
        try:
            connection = await connect(env, server)
            try:
                found[server.name] = offered(server, await connection.list_tools(MAX_PAGES))
            finally:
                await connection.close()
        except RuntimeError as exc:  # what it says of its env's values (its stderr's tail), masked
            raise UsageError(f"--mcp_config: {_masked(server, str(exc))}") from None
        finally:
            if env is not None:
                await env.close()
    return found


def started(servers: tuple[Server, ...], settings: EnvironmentSettings) -> Listing:
    """At the run's start, in the driver: what each server offers, registered as its toolset."""
    listed = asyncio.run(listing(servers, backend_for(settings)))
    register(servers, listed)
    return listed


def offered(server: Server, tools: list[types.Tool]) -> list[dict]:
    """The OpenAI tool objects of what `server` lists and its allowlist keeps; RuntimeError naming the server
    for a listing that cannot be offered."""
    if len(tools) > MAX_TOOLS:
        raise RuntimeError(f"{server} lists {len(tools)} tools, more than {MAX_TOOLS}")
    by_name = {tool.name: tool for tool in tools}
    missing = [name for name in server.allowed or () if name not in by_name]
    if missing:
        raise RuntimeError(f"{server} has no tool {missing[0]!r} (it lists {', '.join(by_name) or 'none'})")
    kept = [by_name[name] for name in server.allowed] if server.allowed is not None else tools
    schemas = []
    for tool in kept:
        parameters = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object"}
        schema = {
            "type": "function",
            "function": {
                "name": server.offered(tool.name),
                "description": " ".join((tool.description or "").split()),
                "parameters": parameters,
            },
        }
        size = len(json.dumps(schema))
        if size > MAX_SCHEMA or safejson.depth(schema) > MAX_DEPTH:
            raise RuntimeError(
                f"{server}: the schema of {tool.name!r} is {size} bytes or deeper than {MAX_DEPTH} "
                f"levels, more than a tool's may be ({MAX_SCHEMA} bytes)"
            )
        schemas.append(schema)
    return schemas


def register(servers: tuple[Server, ...], listed: Listing) -> None:
    """Each server a toolset of the tools `listed` gave it (in the registry, beside the built-in ones)."""
    for server in servers:
        functions = [_tool(server, schema) for schema in listed.get(server.name, [])]
        with registry.registering_as(f"--mcp_config {server.source}"):
            if not functions:
                raise registry.RegistryError(f"--mcp_config: {server} offers no tool")
            registry.toolset(server.name, functions)


def _tool(server: Server, schema: dict) -> Callable:
    offered_name = schema["function"]["name"]
    name = offered_name.removeprefix(f"{server.name}__") if server.prefix else offered_name

    async def call(session: Any, **arguments: Any) -> dict:
        try:
            connection = await session.resource(resource(server), lambda: connect(session.env, server))
            return as_result(await connection.call(name, arguments), session.redact)
        except RuntimeError as exc:  # the server's words (an error it answered, its stderr): its result's bounds
            return {"error": session.redact(capped(str(exc), RESULT_LIMIT))}

    call.__name__ = call.__qualname__ = offered_name
    call.tool_schema = schema  # type: ignore[attr-defined]  # Tool.of takes it as it is
    session = inspect.Parameter("session", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    anything = inspect.Parameter("arguments", inspect.Parameter.VAR_KEYWORD)
    call.__signature__ = inspect.Signature([session, anything])  # type: ignore[attr-defined]  # the server checks
    return call


def resource(server: Server) -> str:
    return f"mcp:{server.name}"


async def open_servers(session: Any, servers: tuple[Server, ...]) -> None:
    """Every server connected for this sample and asked for its tools, before any model call: what each
    lists, bounded and allowlisted as at the start, is what the sample is offered of it (`session.listed`).
    SetupError (the sample fails) naming the server that does not start (with its stderr's tail), lists what
    cannot be offered, or lists a tool another toolset has."""
    ours = {server.name for server in servers}
    owners = {name: tool.toolset for name, tool in every_tool().items() if tool.toolset not in ours}
    for server in servers:
        try:
            connection = await session.resource(resource(server), lambda server=server: connect(session.env, server))
            listed = offered(server, await connection.list_tools(MAX_PAGES))
        except RuntimeError as exc:
            raise SetupError(session.redact(str(exc))) from None
        tools = [Tool.of(server.name, _tool(server, schema)) for schema in listed]
        for tool in tools:
            if tool.name in owners:
                raise SetupError(
                    f"{server} lists {tool.name!r} for this sample, a tool of toolset {owners[tool.name]!r} too "
                    f'("prefix": true offers its tools as {server.name}__TOOL)'
                )
            owners[tool.name] = server.name
        session.listed[server.name] = tools


def as_result(result: types.CallToolResult, redact: Callable[[str], str]) -> dict:
    """What the model reads: the text content (redacted, capped), a note for any other kind."""
    import mcp_types as types  # loaded by the connection that gave `result`

    parts = [item.text if isinstance(item, types.TextContent) else _note(item) for item in result.content]
    if not parts and result.structured_content is not None:
        parts = [safejson.dumps(result.structured_content).decode()]
    text = redact(capped("\n".join(parts), RESULT_LIMIT))
    return {"error": text or "the tool reported an error"} if result.is_error else {"result": text}


def _masked(server: Server, text: str) -> str:
    """`text` with the values of the server's env and headers masked, as the run's secrets are."""
    return Secrets([*server.env.values(), *server.headers.values()]).redact(text)


def _note(item: Any) -> str:
    kind = getattr(item, "type", type(item).__name__)
    data = getattr(item, "data", None)
    size = f", {len(data)} characters of base64" if isinstance(data, str) else ""
    mime = getattr(item, "mime_type", None)
    return f"[{kind} content{f' ({mime})' if mime else ''}{size}: not shown]"
