"""What the disk bound (--max_disk_mb) costs per sample, in each backend that enforces it.

    python bench/disk.py --repeats 20

For local and bwrap, samples are opened and closed one after another in one worker (a backend), with
the bound (10240 MB, the default) and without it (0): once empty, once empty and verified (its clean
room entered: the disk's verification reserve, kept from one sample to the next otherwise, is given back
and made anew), and once after a command that writes what a small task does (200 files and 20 MB). The
first sample of a worker slot makes its image (mkfs, mount): timed apart. Each figure is a median in
ms, and the bound's extra cost per sample is given as a ratio to one plain command (`true`) in the same
environment. Needs the host's root (the images are mounted), as the bound itself does.

Then the CPU (the runner's and its children's, user and system) of making one image of 10240 MB, not
mounted: by mkfs.ext4, as the worker's first image of a size is (its template), and from that template's
data in memory, as every further one is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import tempfile
import time

from trajforge import plugins
from trajforge.environments import EnvironmentSettings, backend_for, disk
from trajforge.environments.limits import RUNNER, Limits

WORK = "mkdir d && i=0; while [ $i -lt 200 ]; do echo $i > d/f$i; i=$((i+1)); done; head -c 20000000 /dev/zero > big"

# (label, the sample's command, whether it is verified): the clean room's entry (a scan of the workspace
# with `find`) is timed in both the bounded and the unbounded sample; what differs is the reserve made again.
CASES = (
    ("empty sample", None, False),
    ("empty sample, verified", None, True),
    ("sample writing 200 files + 20 MB", WORK, False),
)


def settings(kind: str, size_mb: int) -> EnvironmentSettings:
    return EnvironmentSettings(kind=kind, run_dir=tempfile.mkdtemp(), limits=Limits(max_disk_mb=size_mb))


async def samples(kind: str, size_mb: int, repeats: int, work: str | None, verify: bool) -> tuple[list[float], float]:
    """(the time of each sample's open+close after the first, the first's); with `verify`, its clean room
    entered too (which takes the disk's verification reserve: the next sample's open makes it anew)."""
    backend = backend_for(settings(kind, size_mb))
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        env = await backend.open({})
        opened = time.perf_counter() - started
        if work:
            assert (await env.exec(work)).exit_code == 0
        started = time.perf_counter()
        if verify:
            await env.enter_clean_room()
        await env.close()
        times.append(opened + time.perf_counter() - started)
    return times[1:], times[0]


async def plain(kind: str, repeats: int) -> float:
    env = await backend_for(settings(kind, 0)).open({})
    try:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            await env.exec("true")
            times.append(time.perf_counter() - started)
        return statistics.median(times)
    finally:
        await env.close()


def cpu() -> float:
    """Seconds of CPU of this process and its waited-for children."""
    mine, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def making(size_mb: int, repeats: int) -> tuple[float, float]:
    """The median CPU of making an image of `size_mb` by mkfs and from the template, in seconds."""
    folder = tempfile.mkdtemp(prefix="batch-runner-bench-")
    try:
        disk._template("bench", size_mb, "batch-runner-bench-")  # made once, as by a worker's first image of a size
        times: dict[str, list[float]] = {"mkfs": [], "copy": []}
        for n in range(repeats):
            for way in times:
                image = os.path.join(folder, f"{way}{n}")
                started = cpu()
                if way == "mkfs":
                    disk._mkfs(image, size_mb)
                else:
                    disk._make_image(image, "bench", size_mb, "batch-runner-bench-")
                times[way].append(cpu() - started)
                os.unlink(image)
        return statistics.median(times["mkfs"]), statistics.median(times["copy"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    plugins.load()  # the built-in backends, as a run registers them
    warning = disk.unenforced(10240, "bwrap", RUNNER)
    if warning:
        raise SystemExit(warning)
    for kind in ("local", "bwrap"):
        command = asyncio.run(plain(kind, args.repeats))
        print(f"{kind}: a plain command {1000 * command:.1f} ms")
        for label, work, verify in CASES:
            without, _ = asyncio.run(samples(kind, 0, args.repeats, work, verify))
            bounded, first = asyncio.run(samples(kind, 10240, args.repeats, work, verify))
            extra = statistics.median(bounded) - statistics.median(without)
            print(
                f"  {label:34} open+close {1000 * statistics.median(without):6.1f} ms unbounded, "
                f"{1000 * statistics.median(bounded):6.1f} ms bounded: {extra / command:+5.1f}x a plain command "
                f"(the slot's first, making its image: {1000 * first:.0f} ms)"
            )
    mkfs, copy = making(10240, args.repeats)
    print(
        f"making an image of 10240 MB: {1000 * mkfs:.2f} ms of CPU by mkfs.ext4, {1000 * copy:.2f} ms as a copy "
        f"of the template ({mkfs / max(copy, 1e-6):.0f}x less)"
    )


if __name__ == "__main__":
    main()
