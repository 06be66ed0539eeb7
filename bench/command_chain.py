"""What one bwrap command costs in CPU before and around what it runs: its exec chain (the cgroup join and
file size rlimit, the slot's mount namespace, the drop to nobody of a root runner, bwrap and its mounts),
measured through the environment API as a sample runs it, with the run's default limits and disk.

    PYTHONPATH=. python bench/command_chain.py --repeats 200

`--repeats` commands (`true`) are run in one environment, the agent's and then the clean room's; the CPU
of the processes they started (their children's rusage: user + system), and of this process, per
command, in ms. Against another checkout: `PYTHONPATH=/path/to/it python bench/command_chain.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import time

from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for, prepare_run


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


async def measure(repeats: int) -> dict[str, tuple[float, float, float]]:
    settings = EnvironmentSettings(kind="bwrap", run_dir=tempfile.mkdtemp())
    prepare_run(settings, resume=False)
    env = await backend_for(settings).open({})
    figures: dict[str, tuple[float, float, float]] = {}
    try:
        for room in ("agent", "clean room"):
            if room == "clean room":
                await env.enter_clean_room()
            await env.exec("true")  # the first command's one-off costs out of the figures
            children, own, wall = _cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(repeats):
                result = await env.exec("true")
                assert result.exit_code == 0, result.output
            figures[room] = tuple(  # type: ignore[assignment]
                1000 * (after - before) / repeats
                for after, before in (
                    (_cpu(resource.RUSAGE_CHILDREN), children),
                    (_cpu(resource.RUSAGE_SELF), own),
                    (time.perf_counter(), wall),
                )
            )
    finally:
        await env.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    plugins.load()  # the built-in backends
    with open("/proc/self/mountinfo") as handle:
        mounts = sum(1 for _ in handle)
    print(f"uid {os.geteuid()}, {mounts} mounts on the host; per command, ms (`true`, {args.repeats} runs)")
    print(f"{'':12} {'chain CPU':>10} {'runner CPU':>11} {'wall':>7}")
    for room, (children, own, wall) in asyncio.run(measure(args.repeats)).items():
        print(f"{room:12} {children:10.2f} {own:11.2f} {wall:7.2f}")


if __name__ == "__main__":
    main()
