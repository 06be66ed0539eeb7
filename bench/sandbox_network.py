"""What --sandbox_network costs under bwrap: a sample's start and end (pasta and its namespace) and one
command (the nsenter in its exec chain), against the same without it.

    python bench/sandbox_network.py --repeats 20

For each setting, `--repeats` environments are opened and closed (open+close), and in one environment
`--repeats` plain commands (`true`) are run; medians and max in ms, and the ratio with/without.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for


async def measure(network: bool, repeats: int) -> dict[str, list[float]]:
    settings = EnvironmentSettings(kind="bwrap", run_dir=tempfile.mkdtemp(), sandbox_network=network)
    backend = backend_for(settings)
    times: dict[str, list[float]] = {"open+close": [], "command": []}
    for _ in range(repeats):
        started = time.perf_counter()
        await (await backend.open({})).close()
        times["open+close"].append(time.perf_counter() - started)
    env = await backend.open({})
    try:
        await env.exec("true")  # the first command's one-off costs out of the figures
        for _ in range(repeats):
            started = time.perf_counter()
            result = await env.exec("true")
            times["command"].append(time.perf_counter() - started)
            assert result.exit_code == 0, result.output
    finally:
        await env.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    plugins.load()  # the built-in backends
    without = asyncio.run(measure(False, args.repeats))
    with_network = asyncio.run(measure(True, args.repeats))
    print(f"{'':12} {'without ms':>12} {'with ms':>10} {'ratio':>7}   (median; max in brackets)")
    for name in without:
        off, on = statistics.median(without[name]) * 1000, statistics.median(with_network[name]) * 1000
        worst = max(with_network[name]) * 1000
        print(f"{name:12} {off:12.1f} {on:10.1f} {on / off:7.2f}   [{max(without[name]) * 1000:.1f}, {worst:.1f}]")


if __name__ == "__main__":
    main()
