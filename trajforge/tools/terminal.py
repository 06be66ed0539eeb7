"""The terminal toolset."""

from __future__ import annotations

from trajforge.tools.session import ToolSession


async def terminal(session: ToolSession, command: str, timeout: int | None = None) -> dict:
    """Run a shell command (sh -c) in the task's working directory and return its combined output
    and exit code. Each call starts a fresh shell, so `cd` and variables do not carry over; chain
    commands with && instead. Long output is cut in the middle.

    Args:
        command: the shell command to run
        timeout: seconds before the command and all its children are killed (capped by the run's limit)
    """
    result = await session.env.exec(command, timeout)
    return {"output": result.output, "exit_code": result.exit_code, "error": result.error}
