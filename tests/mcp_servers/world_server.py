"""An MCP server written with the official SDK, for tests/test_mcp.py, whose tools are its sample's: it reads
world.json in the sample's workspace (MCP_WORKSPACE, which the dataset's `files` fills) and offers
`look`, whose schema names the rooms the file lists, and a tool for each other name it lists. Without the
file (the run's start, where no task is in place) it offers `look` of a hall and a porch alone.

    world.json: {"rooms": ["attic", ...], "tools": ["north", ...], "look": false}

    python world_server.py                 stdio
"""

import json
import os
from pathlib import Path
from typing import Literal

from mcp.server.mcpserver import MCPServer

found = Path(os.environ.get("MCP_WORKSPACE", "."), "world.json")
world = json.loads(found.read_text()) if found.exists() else {}
server = MCPServer("world")
Room = Literal[tuple(world.get("rooms", ["hall", "porch"]))]  # type: ignore[valid-type]  # the task's rooms: the schema's enum


def look(room: Room) -> str:  # type: ignore[valid-type]
    """Look around a room of this world."""
    return f"you are in the {room}"


def walker(name: str):
    def walk(steps: int) -> str:
        return f"{name}: walked {steps} steps"

    return walk


if world.get("look", True):
    server.add_tool(look)
for name in world.get("tools", []):
    server.add_tool(walker(name), name=name, description=f"Walk {name}.")

if __name__ == "__main__":
    server.run()
