"""What reading a task's folder costs: in the runner's process (a dataset file of root's, or a runner that is
not root), against the helper process a root runner starts to read a dataset file of another user with
that user's rights (trajforge/verification/host_folders.py).

    sudo python bench/host_folders.py [--repeats 30] [--files 200]

A workspace of `--files` small files (and one of 1 MB) in a /tmp folder every user can reach is read
`--repeats` times each way, alternating; medians and maxima in ms, and the helper's median as a ratio to the
in-process one; then the load's check of the folder (one helper for every folder of a dataset). Must run
as root (the helper drops to uid 65534).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's package, from any cwd

from trajforge.verification.host_folders import HostFolders

NOBODY = 65534


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--files", type=int, default=200)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the helper process is what a root runner starts")
    top = Path(tempfile.mkdtemp(prefix="task-folders-bench-", dir="/tmp"))
    try:
        top.chmod(0o755)
        workspace = top / "repo"
        for index in range(args.files):
            path = workspace / f"pkg{index % 10}" / f"module{index}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"VALUE = {index}\n" * 20)
        (workspace / "data.bin").write_bytes(os.urandom(1 << 20))
        (top / "root.jsonl").write_text("")
        (top / "nobody.jsonl").write_text("")
        os.chown(top / "nobody.jsonl", NOBODY, NOBODY)
        ways = {
            "in process (owner root)": HostFolders.of(top / "root.jsonl"),
            "helper as uid 65534": HostFolders.of(top / "nobody.jsonl"),
        }
        assert ways["helper as uid 65534"].owner is not None and ways["in process (owner root)"].owner is None
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeats):
            for name, folders in ways.items():
                started = time.perf_counter()
                found = folders.read("repo")
                times[name].append((time.perf_counter() - started) * 1000)
                assert len(found) == args.files + 1
        base = statistics.median(times["in process (owner root)"])
        print(f"reading a workspace of {args.files + 1} files ({args.repeats} times each way)")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"  {name:26} median {median:7.1f} ms   max {max(values):7.1f} ms   x{median / base:.1f}")
        print(f"  the helper adds {statistics.median(times['helper as uid 65534']) - base:.1f} ms per folder read")
        helper = ways["helper as uid 65534"]
        checks = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            assert helper.unreadable(["repo"]) == {}
            checks.append((time.perf_counter() - started) * 1000)
        print(f"  the load's check (one helper opens every file): median {statistics.median(checks):.1f} ms")
    finally:
        shutil.rmtree(top)


if __name__ == "__main__":
    main()
