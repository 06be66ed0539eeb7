"""An MCP server written with the official SDK, for tests/test_mcp.py: a key-value store held in the
server's memory (so a sample sees only what its own server process was told), and tools that show what
the sandbox lets a server do (its uid, the network, which its sample's commands share), one that hangs,
one that starts a child of its own, one that imports a module lazily, one that reads the workspace,
two that say the value of a variable of its env (in an error, on stderr as it dies).

    python kv_server.py                    stdio
    python kv_server.py http PORT          streamable HTTP on 127.0.0.1:PORT
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError

server = MCPServer("kv")
store: dict[str, str] = {}


@server.tool()
def put(key: str, value: str) -> str:
    """Store a value under a key."""
    store[key] = value
    return f"stored {key}"


@server.tool()
def get(key: str) -> str:
    """The value stored under a key."""
    return store.get(key, f"no value for {key}")


@server.tool()
def whoami() -> str:
    """The server's uid, pid and the start of its working folder."""
    return f"uid={os.getuid()} pid={os.getpid()} cwd={os.getcwd()}"


@server.tool()
def variable(name: str) -> str:
    """The value of one of the server's environment variables."""
    return os.environ.get(name, f"no variable {name}")


@server.tool()
def reach(host: str, port: int) -> str:
    """Whether a TCP connection to host:port opens."""
    try:
        with socket.create_connection((host, port), timeout=3):
            return "connected"
    except OSError as exc:
        return f"no connection: {exc}"


@server.tool()
def listen(port: int) -> str:
    """Listen on 127.0.0.1:port of the server's network namespace, accepting in the background."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    threading.Thread(target=lambda: [listener.accept() for _ in iter(int, 1)], daemon=True).start()
    return f"listening on {port}"


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "woke up"


@server.tool()
def big(size: int) -> str:
    """A result of `size` characters."""
    return "x" * size


@server.tool()
async def ask_model(question: str, ctx: Context) -> str:
    """Ask the client's model (MCP sampling), which a client that refuses answers with an error."""
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=question))
    try:
        reply = await ctx.session.create_message([message], max_tokens=10)
    except Exception as exc:
        return f"refused: {type(exc).__name__}: {exc}"
    return f"the client's model answered: {reply}"


@server.tool()
def mean(numbers: list[float]) -> str:
    """The mean of some numbers, by a module imported when first needed."""
    import statistics

    return str(statistics.mean(numbers))


@server.tool()
def workspace_file(name: str) -> str:
    """A file of the sample's workspace (MCP_WORKSPACE), read."""
    with open(os.path.join(os.environ["MCP_WORKSPACE"], name)) as file:
        return file.read()


@server.tool()
def leak_error(name: str) -> str:
    """Answer with a protocol error that quotes one of the server's environment variables."""
    raise MCPError(code=-32000, message=f"backend said {os.environ.get(name)}")


@server.tool()
def crash_saying(name: str) -> str:
    """Write one of the server's environment variables on stderr, then exit."""
    sys.stderr.write(f"fatal: token={os.environ.get(name)}\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def spawn_child(marker: str) -> str:
    """Start a long-lived child process of its own, outside the server's process group."""
    child = subprocess.Popen(["sleep", "300", marker], start_new_session=True)
    return f"child {child.pid}"


if __name__ == "__main__":
    # A sample whose workspace holds it: this server fails to start there.
    if os.path.exists(os.path.join(os.environ.get("MCP_WORKSPACE", "."), "refuse_to_start")):
        sys.stderr.write("kv: refusing to start in this workspace\n")
        sys.exit(3)
    if len(sys.argv) > 1 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
