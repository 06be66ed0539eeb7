"""What a stdio MCP server costs per sample (--mcp_config): started in the sample's sandbox, initialized,
one tools/call, and ended, as a ratio to one plain command (`true`) in the same environment.

    python bench/mcp_start.py --repeats 10

The server is tests/mcp_servers/kv_server.py, written with the official SDK, run by the system's Python
with a copy of the SDK every uid may read (in bwrap, a root runner's sandbox user is nobody, who cannot
read /root). Each figure is a median in ms, over `repeats` samples opened one after another in one backend.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from mcp_servers import readable_sdk  # noqa: E402

from trajforge import plugins  # noqa: E402
from trajforge.environments import EnvironmentSettings, backend_for  # noqa: E402
from trajforge.tools.mcp.connection import MESSAGE_LIMIT, Connection  # noqa: E402
from trajforge.tools.mcp.servers import Server  # noqa: E402


async def measure(kind: str, server: Server, repeats: int) -> tuple[float, float, float, float]:
    """Medians in seconds: a plain command; spawn + initialize; one tools/call; the server's end."""
    backend = backend_for(EnvironmentSettings(kind=kind, run_dir=tempfile.mkdtemp()))
    plain, start, call, end = [], [], [], []
    for _ in range(repeats):
        env = await backend.open({})
        try:
            began = time.perf_counter()
            assert (await env.exec("true")).exit_code == 0
            plain.append(time.perf_counter() - began)
            began = time.perf_counter()
            spawned = await env.spawn(list(server.command), server.env, server.readable, MESSAGE_LIMIT)
            connection = await Connection.stdio(server, spawned)
            start.append(time.perf_counter() - began)
            began = time.perf_counter()
            await connection.call("put", {"key": "k", "value": "v"})
            call.append(time.perf_counter() - began)
            began = time.perf_counter()
            await connection.close()
            end.append(time.perf_counter() - began)
        finally:
            await env.close()
    return tuple(statistics.median(times) for times in (plain, start, call, end))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    plugins.load()  # the built-in backends
    if not readable_sdk.system_python_fits():
        raise SystemExit(f"{readable_sdk.SYSTEM_PYTHON} is not Python {sys.version_info[:2]}: the SDK copy needs it")
    folder = Path(tempfile.mkdtemp(prefix="batch-runner-bench-mcp-"))
    try:
        sdk = str(readable_sdk.copy_sdk(folder))
        script = str(folder / "kv_server.py")
        shutil.copy(TESTS / "mcp_servers" / "kv_server.py", script)
        Path(script).chmod(0o644)
        server = Server(
            "kv",
            "bench",
            60.0,
            60.0,
            (readable_sdk.SYSTEM_PYTHON, script),
            env={"PYTHONPATH": sdk},
            readable=(sdk, script),
        )
        for kind in ("local", "bwrap"):
            plain, start, call, end = asyncio.run(measure(kind, server, args.repeats))
            total = start + call + end
            print(
                f"{kind}: a plain command {1000 * plain:.1f} ms; the server: start+initialize {1000 * start:.0f} ms, "
                f"a call {1000 * call:.1f} ms, its end {1000 * end:.0f} ms; per sample {1000 * total:.0f} ms "
                f"= {total / plain:.0f}x a plain command"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
