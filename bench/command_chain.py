"""What one bwrap command costs in CPU before and around what it runs: its exec chain (the cgroup join and
file size rlimit, the slot's mount namespace, the drop to nobody of a root runner, bwrap and its mounts),
measured through the environment API as a sample runs it, with the run's default limits and disk.

    PYTHONPATH=. python bench/command_chain.py --repeats 200

`--repeats` commands (`true`) are run in one environment, the agent's and then the clean room's; the CPU
of the processes they started, and of this process, per command, in ms. The processes' CPU is that of a
cpuacct cgroup (v1) this process moves into, less its own: every process of the chain, also bwrap's
PID-namespace init, which outlives an agent's bwrap (it is no child of ours: our children's rusage never
holds it, which made an agent's command look 4x cheaper than a clean room's, where bwrap waits for it).
Without that cgroup (not root, cgroup v2 alone) it is our children's rusage, said so.
Against another checkout: `PYTHONPATH=/path/to/it python bench/command_chain.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import tempfile
import time

from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for, prepare_run

CPUACCT = "/sys/fs/cgroup/cpuacct"
SETTLE = 1.0  # s after a room's commands: what outlives a command ends (its CPU counted) before the reading


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _own_cgroup() -> str:
    """A cpuacct cgroup this process (and so every process it starts) is in from now, or "" where none."""
    path = os.path.join(CPUACCT, f"command-chain-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
    except OSError:
        return ""
    return path


def _processes_cpu(cgroup: str) -> float:
    """s of CPU of this process and every process it started: the cgroup's, else our own plus our children's."""
    if not cgroup:
        return _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
    with open(os.path.join(cgroup, "cpuacct.usage")) as handle:
        return int(handle.read()) / 1e9


def _leave(cgroup: str) -> None:
    """Out of the cgroup, which goes once the helpers still in it (the worker's namespaces') have ended
    with this process: a detached shell removes it, for at most a minute."""
    if cgroup:
        with open(os.path.join(CPUACCT, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
        remove = 'for _ in $(seq 300); do rmdir "$1" 2>/dev/null && exit; sleep 0.2; done'
        subprocess.Popen(["sh", "-c", remove, "sh", cgroup], start_new_session=True)


async def measure(repeats: int, cgroup: str) -> dict[str, tuple[float, float, float]]:
    settings = EnvironmentSettings(kind="bwrap", run_dir=tempfile.mkdtemp())
    prepare_run(settings, resume=False)
    env = await backend_for(settings).open({})
    figures: dict[str, tuple[float, float, float]] = {}
    try:
        for room in ("agent", "clean room"):
            if room == "clean room":
                await env.enter_clean_room()
            await env.exec("true")  # the first command's one-off costs out of the figures
            processes, own, wall = _processes_cpu(cgroup), _cpu(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(repeats):
                result = await env.exec("true")
                assert result.exit_code == 0, result.output
            wall = time.perf_counter() - wall
            await asyncio.sleep(SETTLE)
            own = _cpu(resource.RUSAGE_SELF) - own
            chain = _processes_cpu(cgroup) - processes - own
            figures[room] = (1000 * chain / repeats, 1000 * own / repeats, 1000 * wall / repeats)
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
    cgroup = _own_cgroup()
    counted = "a cpuacct cgroup" if cgroup else "our children's rusage: misses bwrap's init where it outlives bwrap"
    print(f"uid {os.geteuid()}, {mounts} mounts on the host; per command, ms (`true`, {args.repeats} runs)")
    print(f"chain CPU: every process of the chain but the runner, from {counted}")
    print(f"{'':12} {'chain CPU':>10} {'runner CPU':>11} {'wall':>7}")
    try:
        figures = asyncio.run(measure(args.repeats, cgroup))
    finally:
        _leave(cgroup)
    for room, (chain, own, wall) in figures.items():
        print(f"{room:12} {chain:10.2f} {own:11.2f} {wall:7.2f}")


if __name__ == "__main__":
    main()
