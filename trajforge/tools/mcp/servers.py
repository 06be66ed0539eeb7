"""--mcp_config: MCP servers as most clients write them, each a toolset named after its server.

    {"mcpServers": {
        "notes": {"command": "python3", "args": ["notes_server.py"], "env": {"NOTES_LIMIT": "10"}},
        "shared": {"url": "http://127.0.0.1:8000/mcp", "tools": ["lookup"], "prefix": true}
    }}

`command` (and `args`, `env`): a stdio server, started in each sample's sandbox; `url`: a streamable HTTP
server, shared by every sample. `tools`: the tools offered (all by default); `prefix`: its tools are
offered as NAME__tool; `readable`: host folders a stdio server's sandbox may read (a virtualenv). An
argument naming a file or folder beside the config file is given as its absolute path and made readable.
The values of `env` are never written anywhere (run.json keeps the file's digest).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.errors import UsageError

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
KEYS = {"command", "args", "env", "url", "headers", "tools", "prefix", "readable", "type"}  # "type" as clients write it


@dataclass(frozen=True)
class Server:
    name: str  # its toolset's
    source: str  # the config file
    call_timeout: float  # --command_timeout: a tools/call
    start_timeout: float  # --setup_timeout: started and initialized
    command: tuple[str, ...] = ()  # a stdio server: its argv
    url: str = ""  # a streamable HTTP server
    env: dict[str, str] = field(default_factory=dict, repr=False, compare=False)  # values never written
    headers: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    readable: tuple[str, ...] = ()  # host paths its sandbox reads
    allowed: tuple[str, ...] | None = None  # None: every tool it lists
    prefix: bool = False

    @property
    def stdio(self) -> bool:
        return bool(self.command)

    def offered(self, tool: str) -> str:
        """The name the model calls `tool` of this server by."""
        return f"{self.name}__{tool}" if self.prefix else tool

    def __str__(self) -> str:
        return f"MCP server {self.name!r} ({self.source})"


def read(paths: list[str], call_timeout: float, start_timeout: float) -> tuple[Server, ...]:
    """Every server of the config files, checked; UsageError naming the file and the server."""
    servers: dict[str, Server] = {}
    for path in paths:
        for server in _read_file(Path(path), call_timeout, start_timeout):
            if server.name in servers:
                raise UsageError(
                    f"--mcp_config: server {server.name!r} is in both {servers[server.name].source} and {path}"
                )
            servers[server.name] = server
    return tuple(servers.values())


def _read_file(path: Path, call_timeout: float, start_timeout: float) -> list[Server]:
    where = f"--mcp_config {path}"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{where}: not valid JSON ({exc})") from None
    found = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(found, dict) or not found:
        raise UsageError(f'{where}: needs {{"mcpServers": {{NAME: {{"command": ...}} or {{"url": ...}}}}}}')
    return [
        _server(name, spec, path, f"{where}: server {name!r}", call_timeout, start_timeout)
        for name, spec in found.items()
    ]


def _server(name: str, spec: Any, path: Path, where: str, call_timeout: float, start_timeout: float) -> Server:
    if not NAME.match(name):
        raise UsageError(f"{where}: a name is 1-64 letters, digits, '_' or '-' (it names its toolset)")
    if not isinstance(spec, dict):
        raise UsageError(f"{where}: needs an object with a command or a url")
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; a server takes {', '.join(sorted(KEYS))}")
    if ("command" in spec) == ("url" in spec):
        raise UsageError(f"{where}: needs either a command (stdio) or a url (streamable HTTP), not both")
    env, headers = (_texts(spec.get(key, {}), f"{where}: {key}") for key in ("env", "headers"))
    allowed = spec.get("tools")
    if allowed is not None and (not isinstance(allowed, list) or not all(isinstance(t, str) for t in allowed)):
        raise UsageError(f"{where}: tools must be a list of tool names")
    if not isinstance(spec.get("prefix", False), bool):
        raise UsageError(f"{where}: prefix must be true or false")
    common = {
        "name": name,
        "source": str(path),
        "call_timeout": call_timeout,
        "start_timeout": start_timeout,
        "allowed": None if allowed is None else tuple(allowed),
        "prefix": spec.get("prefix", False),
    }
    if "url" in spec:
        url = spec["url"]
        if not isinstance(url, str) or not re.match(r"^https?://", url):
            raise UsageError(f"{where}: url must be an http:// or https:// URL")
        return Server(url=url, headers=headers, **common)
    command, args = spec["command"], spec.get("args", [])
    if not isinstance(command, str) or not command or not isinstance(args, list):
        raise UsageError(f"{where}: command must be a program and args a list of strings")
    if not all(isinstance(arg, str) for arg in args):
        raise UsageError(f"{where}: args must be a list of strings")
    readable = [str(Path(p).resolve()) for p in _texts_list(spec.get("readable", []), f"{where}: readable")]
    argv = []
    for arg in [command, *args]:
        beside = path.parent / arg
        if arg and not Path(arg).is_absolute() and ("/" in arg or "." in arg) and beside.exists():
            arg = str(beside.resolve())  # a file beside the config: the same file wherever the run starts
            readable.append(arg)
        argv.append(arg)
    return Server(command=tuple(argv), env=env, readable=tuple(dict.fromkeys(readable)), **common)


def _texts(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise UsageError(f"{where} must be an object of strings")
    return dict(value)


def _texts_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise UsageError(f"{where} must be a list of paths")
    return value
