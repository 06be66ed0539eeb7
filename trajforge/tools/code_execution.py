"""The code_execution toolset: run a Python program in the prompt's environment (its container, when
one is used), with stdout and stderr kept apart.

No distribution the Hermes agent ships samples this toolset; the `code_execution` distribution does.
"""

from __future__ import annotations

import hashlib

from trajforge.tools.session import ToolSession


async def execute_code(session: ToolSession, code: str, timeout: int | None = None) -> dict:
    """Run a Python 3 program in the working directory and return its stdout, stderr and exit code.
    Each call is a fresh process; files it writes stay. On timeout the program and its children are
    killed and the output so far comes back.

    Args:
        code: the whole program
        timeout: seconds before the program is killed (capped by the run's limit)
    """
    # Named after the code, not at random: a traceback quotes the name, and a re-run must show the same.
    name = f".execute_code-{hashlib.sha256(code.encode()).hexdigest()[:12]}"
    script, out, err = f"{name}.py", f"{name}.out", f"{name}.err"
    env = session.env
    await env.write_file(script, code)
    try:
        run = await env.exec(
            f'PY=$(command -v python3 || command -v python) || {{ echo "no python in this environment" > {err}; '
            f'exit 127; }}; "$PY" {script} > {out} 2> {err}',
            timeout,
        )
        # Read through exec: its output cap keeps the head and tail of a flood, with a marker.
        stdout = await env.exec(f"cat {out} 2>/dev/null")
        stderr = await env.exec(f"cat {err} 2>/dev/null")
    finally:
        await env.exec(f"rm -f {script} {out} {err}")
    result = {"stdout": stdout.output, "stderr": stderr.output, "exit_code": run.exit_code}
    if run.error:  # the timeout: the call counts as failed
        result["error"] = run.error
    return result
