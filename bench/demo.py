"""The README's demo command, timed: what a newcomer waits for on the first run.

    python bench/demo.py --runs 5
    python bench/demo.py --runs 3 --python python   # as README types it (a pyenv shim, where there is one)

Runs `batch_runner.py --dataset_file=data/example_prompts.jsonl --batch_size=4 --run_name=demo
--model=mock` from the checkout, each time into a fresh output folder, and prints each run's wall time
and the CPU of its whole process tree (Chromium and the mock server included), then the median.
`--distribution` and `--num_workers` are passed on when given, to compare.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = "--dataset_file=data/example_prompts.jsonl --batch_size=4 --run_name=demo --model=mock"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run it with")
    parser.add_argument("--distribution")
    parser.add_argument("--num_workers", type=int)
    args = parser.parse_args()
    extra = [f"--{name}={value}" for name in ("distribution", "num_workers") if (value := getattr(args, name))]
    walls, cpus = [], []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as output:
            command = [args.python, "batch_runner.py", *DEMO.split(), f"--output_dir={output}", *extra]
            cpu, start = children_cpu(), time.perf_counter()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            wall, used = time.perf_counter() - start, children_cpu() - cpu
        if done.returncode:
            sys.exit(f"run {run + 1} exited with {done.returncode}:\n{done.stderr[-2000:]}")
        walls.append(wall)
        cpus.append(used)
        print(f"run {run + 1}: {wall:.2f} s wall, {used:.2f} s CPU", flush=True)
    print(
        f"median of {args.runs}: {statistics.median(walls):.2f} s wall (min {min(walls):.2f}), "
        f"{statistics.median(cpus):.2f} s CPU"
    )


if __name__ == "__main__":
    main()
