"""What one run costs on a local Ray cluster like tests/test_ray.py's (a head without CPUs, two worker nodes):
the machine's CPU seconds of the whole run, every Ray process it starts included, for three clusters, alternated:
worker nodes of two CPUs, of one CPU, and of one CPU with a head that starts neither the autoscaler's monitor nor
the log monitor (tests/test_ray.py's).

    python bench/ray_cluster.py --runs 3 --rounds 2

Each round starts a cluster, runs test_ray's ENTRIES (nine prompts, three batches, --num_workers=2) `runs`
times against the scripted model, and stops it. Ray's workers are children of a raylet that ignores SIGCHLD,
so no rusage counts them: the CPU is read from a cpuacct cgroup made for the round (cgroup v1, as root).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CGROUPS = Path("/sys/fs/cgroup/cpuacct")
FLAGS = ["--distribution=terminal_only", "--seed=3", "--num_workers=2", "--concurrency=2", "--executor=ray"]
ENTRIES = [{"prompt": f"task {i}"} for i in range(8)] + [{"prompt": "silent [mock reasoning=none]"}]


# variant -> (a worker node's CPUs, the head's arguments beyond test_ray's)
VARIANTS = {
    "nodes of two CPUs": (2, {}),
    "nodes of one CPU": (1, {}),
    "nodes of one CPU, no monitors": (1, {"no_monitor": True, "include_log_monitor": False}),
}


def round_of(variant: str, runs: int, folder: Path) -> None:
    """In this process (already in its cgroup): a cluster, `runs` runs on it, its end."""
    from ray.cluster_utils import Cluster

    from trajforge.mock.server import MockServer

    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    node_cpus, more = VARIANTS[variant]
    head = {"num_cpus": 0, "include_dashboard": False, "_system_config": {"health_check_period_ms": 1000}, **more}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    server = MockServer()
    server.base_url = server.start()
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=node_cpus)
        cluster.wait_for_nodes()
        dataset = folder / "prompts.jsonl"
        dataset.write_text("".join(json.dumps(entry) + "\n" for entry in ENTRIES))
        for run in range(runs):
            command = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=3"]
            command += [f"--run_name=r{run}", f"--output_dir={folder}", f"--base_url={server.base_url}"]
            command += ["--model=bench", "--api_key=bench", *FLAGS, f"--ray_address={cluster.address}"]
            subprocess.run(command, cwd=folder, capture_output=True, check=True)
    finally:
        cluster.shutdown()
        server.stop()


def measured(variant: str, runs: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one round, run in a child process in a cgroup of its own."""
    group = CGROUPS / f"bench-ray-{os.getpid()}-{list(VARIANTS).index(variant)}"
    group.mkdir()
    try:
        with tempfile.TemporaryDirectory() as folder:
            began = time.monotonic()
            child = subprocess.Popen(
                [sys.executable, __file__, "--round", variant, "--runs", str(runs), "--folder", folder],
                preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
            )
            assert child.wait() == 0
            wall = time.monotonic() - began
        return int((group / "cpuacct.usage").read_text()) / 1e9, wall
    finally:
        group.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--round", help=argparse.SUPPRESS)  # a round's child process: its variant
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.round:
        sys.path.insert(0, str(ROOT))
        round_of(args.round, args.runs, Path(args.folder))
        return
    if not os.access(CGROUPS, os.W_OK):
        sys.exit(f"needs a writable cgroup v1 cpuacct hierarchy at {CGROUPS} (root)")
    for number in range(args.rounds):
        for variant in VARIANTS:
            cpu, wall = measured(variant, args.runs)
            line = f"round {number}: {variant}: a cluster and {args.runs} runs on it"
            print(f"{line}: {cpu:.1f} s of CPU, {wall:.1f} s")


if __name__ == "__main__":
    main()
