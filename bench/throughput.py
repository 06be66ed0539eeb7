"""Throughput of a batch run against the scripted server, next to the physical limit.

    python bench/throughput.py --prompts 1000 --latency-ms 300 --workers 2 --concurrency 100

Starts the mock server (trajforge.mock.server) with the given latency (one tool turn, so two model calls a prompt), runs
batch_runner.py on generated prompts, and prints wall time, the ideal time N*K*L/S, efficiency, the
runner's CPU per trajectory (its whole process tree, terminal commands included, the server
excluded), the server's CPU, and the peak RSS of each worker process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
CALLS_PER_PROMPT = 2


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "trajforge.mock.server", "--latency", str(latency), "--turns", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    return server, server.stdout.readline().strip().split("=", 1)[1]


def watch_memory(pid: int, peaks: dict, stop: threading.Event) -> None:
    """Peak RSS of every process under the runner, sampled every 20 ms."""
    try:
        root = psutil.Process(pid)
        while not stop.is_set():
            for proc in [root, *root.children(recursive=True)]:
                try:
                    rss = proc.memory_info().rss
                    if proc.name().startswith("python") or proc.pid == pid:
                        peaks[proc.pid] = max(peaks.get(proc.pid, 0), rss)
                except psutil.Error:
                    pass
            stop.wait(0.02)
    except psutil.Error:
        pass


def run(args: argparse.Namespace) -> dict:
    server, base_url = start_server(args.latency_ms / 1000)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            dataset = Path(tmp, "prompts.jsonl")
            dataset.write_text(
                "".join(json.dumps({"prompt": f"benchmark task {i}"}) + "\n" for i in range(args.prompts))
            )
            command = [
                sys.executable,
                str(ROOT / "batch_runner.py"),
                f"--dataset_file={dataset}",
                f"--batch_size={args.batch_size}",
                "--run_name=bench",
                f"--output_dir={tmp}",
                "--model=bench",
                f"--base_url={base_url}",
                "--api_key=bench",
                "--distribution=terminal_only",
                f"--num_workers={args.workers}",
                f"--concurrency={args.concurrency}",
                f"--executor={args.executor}",
            ]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            peaks: dict[int, int] = {}
            stop = threading.Event()
            started = time.perf_counter()
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            watcher = threading.Thread(target=watch_memory, args=(proc.pid, peaks, stop))
            watcher.start()
            output = proc.communicate()[0]
            wall = time.perf_counter() - started
            stop.set()
            watcher.join()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            server_times = psutil.Process(server.pid).cpu_times()
            if proc.returncode != 0:
                sys.exit(f"batch_runner.py failed ({proc.returncode}):\n{output}")
            written = Path(tmp, "bench", "trajectories.jsonl").read_bytes().count(b"\n")
    finally:
        server.kill()
        server.wait()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    server_cpu = server_times.user + server_times.system
    in_flight = min(args.workers * args.concurrency, args.prompts)
    ideal = args.prompts * CALLS_PER_PROMPT * args.latency_ms / 1000 / in_flight
    workers = sorted((rss for pid, rss in peaks.items() if pid != proc.pid), reverse=True)[: args.workers]
    return {
        "prompts": args.prompts,
        "trajectories": written,
        "in_flight": in_flight,
        "wall_s": round(wall, 2),
        "ideal_s": round(ideal, 2),
        "efficiency": round(ideal / wall, 3),
        "cpu_ms_per_trajectory": round(cpu * 1000 / args.prompts, 2),
        "server_cpu_ms_per_trajectory": round(server_cpu * 1000 / args.prompts, 2),
        # With every core busy, no run can beat the CPU both processes need on this machine.
        "cpu_floor_s": round((cpu + server_cpu) / os.cpu_count(), 2),
        "parent_peak_rss_mb": round(peaks.get(proc.pid, 0) / 2**20, 1),
        "worker_peak_rss_mb": [round(rss / 2**20, 1) for rss in workers],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--latency-ms", type=float, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument("--executor", choices=("pool", "ray"), default="pool")
    result = run(parser.parse_args())
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
