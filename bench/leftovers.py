"""What removing a run's leftover disks costs, one after another and on threads (root, mkfs.ext4, loops):

    python bench/leftovers.py --disks 60 --threads 1,16,64 --repeats 2

Makes --disks sample disks as a worker makes them (environments/disk.py: an ext4 image of
--max_disk_mb on a loop device), then unmounts and deletes them as LocalBackend.remove_leftovers
does, with each number of threads; prints wall time and CPU time per disk.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from trajforge.environments import disk, tmpfs
from trajforge.environments.limits import Limits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--disks", type=int, default=60)
    parser.add_argument("--threads", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-disk-mb", type=int, default=10240)
    args = parser.parse_args()
    if not disk.possible():
        raise SystemExit("needs the host's root, mkfs.ext4 and loop devices")
    settings = SimpleNamespace(limits=Limits(max_disk_mb=args.max_disk_mb), run_tag=f"bench{os.getpid()}")
    for _ in range(args.repeats):
        for threads in map(int, args.threads.split(",")):
            disks = [disk.take(settings, f"batch-runner-bench{os.getpid()}-") for _ in range(args.disks)]
            wall, cpu = time.perf_counter(), time.process_time()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(tmpfs.unmount, [made.root for made in disks]))
                list(pool.map(functools.partial(shutil.rmtree, ignore_errors=True), [made.folder for made in disks]))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            per = 1000 / args.disks
            print(
                f"{threads:>3} threads: {wall * per:.1f} ms wall, {cpu * per:.2f} ms CPU per disk "
                f"(load {os.getloadavg()[0]:.0f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
