"""Throughput of batch runs against the scripted server, next to the physical limit, in one run:

    python bench/throughput.py --prompts 1000 --latency-ms 300 --workers 2 --concurrency 100 \\
        --environments local,bwrap --verify both --repeats 3 [--baseline DIR] [--strace 20]

Starts the mock server (trajforge.mock.server) with the given latency (--turns tool turns, 1 by default:
two model calls, a terminal command and a file written a prompt) and runs batch_runner.py on generated prompts, once per
environment, without and with a `verify` command (--verify), --repeats times each, alternating with
the tree in --baseline DIR when given (e.g. `git worktree add DIR main --detach`): before and after
on the same machine at the same moment, medians and their ratio after/before. Per row:

- cpu_ms: the runner's CPU per trajectory (its whole process tree, terminal commands included, the
  server excluded), and sys_ms its system part;
- efficiency: the ideal time prompts x (turns + 1) calls x latency / in flight, over the wall time;
- end_s: from the last batch line to the run's exit, and its parts in order (END_PARTS): shut_s until
  the last worker had exited, merge_s until trajectories.jsonl was written (the exports of --export
  are written in the same pass), stats_s until statistics.json was, report_s until the dataset card and
  report.html were, summary_s until the summary's last line was printed, exit_s until the process
  ended (what the workers left removed, the helpers stopped, the interpreter's exit);
- peak RSS of the parent and of the largest worker.

--strace N also runs N prompts of each row under `strace -f` and counts per sample the clones without
CLONE_VM made by the runner's own (Python) processes (forks of the worker: 0 is the target), the
`/proc` files they opened and the mounts made (bwrap's). --n-samples runs each prompt that many times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
VERIFY = "test -d ."  # as cheap as a verify command gets: what is measured is the runner's part
END_PARTS = ("shut_s", "merge_s", "stats_s", "report_s", "summary_s", "exit_s")


def start_server(latency: float, turns: int) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "trajforge.mock.server", "--latency", str(latency), "--turns", str(turns)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    return server, server.stdout.readline().strip().split("=", 1)[1]


class Watch(threading.Thread):
    """Peak RSS of the runner's Python processes and when its last worker exited, every 20 ms."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peaks, self.workers_gone = pid, {}, 0.0
        self.done = threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
            while not self.done.is_set():
                workers = 0
                for proc in [root, *root.children()]:
                    try:
                        if proc.pid == self.pid or proc.name().startswith("python"):
                            self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), proc.memory_info().rss)
                            workers += proc.pid != self.pid
                    except psutil.Error:
                        pass
                if workers:
                    self.workers_gone = time.time()
                self.done.wait(0.02)
        except psutil.Error:
            pass


def dataset(path: Path, prompts: int, verify: bool) -> None:
    extra = {"verify": VERIFY} if verify else {}
    path.write_text("".join(json.dumps({"prompt": f"benchmark task {i}", **extra}) + "\n" for i in range(prompts)))


def command(tree: Path, tmp: str, base_url: str, args: argparse.Namespace, environment: str, prompts: int) -> list:
    return [
        sys.executable,
        str(tree / "batch_runner.py"),
        f"--dataset_file={tmp}/prompts.jsonl",
        f"--batch_size={args.batch_size}",
        "--run_name=bench",
        f"--output_dir={tmp}",
        "--model=bench",
        f"--base_url={base_url}",
        "--api_key=bench",
        "--distribution=terminal_only",
        f"--num_workers={args.workers}",
        f"--concurrency={args.concurrency}",
        f"--environment={environment}",
        f"--n_samples={args.n_samples}",
        f"--executor={args.executor}",
        *([f"--export={args.export}"] if args.export else []),
    ]


class Output(threading.Thread):
    """The run's output, and when its last line arrived (the summary is the last thing a run prints)."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.lines, self.last = stream, [], 0.0

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line)
            self.last = time.time()


def run_once(tree: Path, base_url: str, args: argparse.Namespace, environment: str, verify: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        dataset(Path(tmp, "prompts.jsonl"), args.prompts, verify)
        before = os.times()
        started = time.perf_counter()
        proc = subprocess.Popen(
            command(tree, tmp, base_url, args, environment, args.prompts),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp,
        )
        watch, output = Watch(proc.pid), Output(proc.stdout)
        watch.start()
        output.start()
        proc.wait()
        ended, wall = time.time(), time.perf_counter() - started
        output.join()
        watch.done.set()
        watch.join()
        after = os.times()
        if proc.returncode != 0:
            sys.exit(f"{tree}/batch_runner.py failed ({proc.returncode}):\n{''.join(output.lines)}")
        folder = Path(tmp, "bench")
        written = (folder / "trajectories.jsonl").read_bytes().count(b"\n")
        last_line = max(path.stat().st_mtime for path in folder.glob("batch_*.jsonl"))
        # The end of the run, step by step: when each step's file was written, in the order the run writes them.
        steps = [
            last_line,
            max(watch.workers_gone, last_line),
            (folder / "trajectories.jsonl").stat().st_mtime,
            (folder / "statistics.json").stat().st_mtime,
            max(path.stat().st_mtime for path in (folder / "README.md", folder / "report.html") if path.exists()),
            output.last,
            ended,
        ]
    samples = args.prompts * args.n_samples
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    in_flight = min(args.workers * args.concurrency, samples)
    ideal = samples * (args.turns + 1) * args.latency_ms / 1000 / in_flight
    workers = [rss for pid, rss in watch.peaks.items() if pid != proc.pid]
    return {
        "trajectories": written,
        "wall_s": wall,
        "efficiency": ideal / wall,
        "cpu_ms": cpu * 1000 / samples,
        "sys_ms": (after.children_system - before.children_system) * 1000 / samples,
        "end_s": ended - last_line,
        **{part: max(end - start, 0.0) for part, start, end in zip(END_PARTS, steps[:-1], steps[1:], strict=True)},
        "parent_rss_mb": watch.peaks.get(proc.pid, 0) / 2**20,
        "worker_rss_mb": max(workers, default=0) / 2**20,
    }


RESULT = re.compile(r"= (\d+)$")


def calls(lines: list[str]):
    """(pid, call text) per system call of an `strace -f` log, an interrupted call joined with its end."""
    pending: dict[str, str] = {}
    for line in lines:
        pid, _, text = line.strip().partition(" ")
        text = text.strip()
        if text.endswith("<unfinished ...>"):
            pending[pid] = text.removesuffix("<unfinished ...>")
        elif text.startswith("<... ") and pid in pending:
            yield int(pid), pending.pop(pid) + text.split(" resumed>", 1)[-1]
        elif text[:1] not in ("+", "-", ""):
            yield int(pid), text


def strace_counts(tree: Path, base_url: str, args: argparse.Namespace, environment: str, verify: bool) -> dict:
    """Per sample, from `strace -f` of a small run: forks by the runner's Python processes, /proc files
    they opened, mounts made by anyone (bwrap's)."""
    small = argparse.Namespace(**{**vars(args), "prompts": args.strace, "concurrency": min(args.concurrency, 10)})
    with tempfile.TemporaryDirectory() as tmp:
        dataset(Path(tmp, "prompts.jsonl"), args.strace, verify)
        trace = Path(tmp, "trace")
        argv = ["strace", "-f", "-o", str(trace), "-e", "trace=clone,clone3,fork,vfork,execve,openat,mount"]
        done = subprocess.run(
            [*argv, *command(tree, tmp, base_url, small, environment, args.strace)], capture_output=True, cwd=tmp
        )
        if done.returncode:
            sys.exit(f"the strace run failed:\n{done.stdout.decode()}{done.stderr.decode()}")
        lines = trace.read_text(errors="replace").splitlines()
    runner = int(lines[0].split()[0])
    python = {runner}  # the runner, its workers and their threads: clones that never exec
    forks = proc_opens = mounts = 0
    for pid, text in calls(lines):
        if text.startswith(("clone(", "clone3(", "fork(", "vfork(")) and pid in python:
            child = RESULT.search(text)
            if child and "CLONE_VM" not in text and not text.startswith("vfork("):
                forks += pid != runner  # the runner's own are its workers
                python.add(int(child.group(1)))
            elif child and "CLONE_THREAD" in text:
                python.add(int(child.group(1)))
        elif text.startswith("execve(") and text.endswith("= 0") and pid != runner:
            python.discard(pid)  # a forked child that became a program: its processes are its own business
        elif text.startswith('openat(AT_FDCWD, "/proc/') and pid in python:
            proc_opens += 1
        elif text.startswith("mount("):
            mounts += 1
    samples = args.strace * args.n_samples
    return {
        "worker_forks": forks / samples,
        "proc_opens": proc_opens / samples,
        "mounts": mounts / samples,
    }


def table(rows: dict[str, dict[str, list[dict]]], trees: list[str], strace: dict) -> str:
    keys = ["cpu_ms", "sys_ms", "efficiency", "wall_s", "end_s", *END_PARTS, "parent_rss_mb", "worker_rss_mb"]
    out = []
    for row, by_tree in rows.items():
        medians = {tree: {k: statistics.median(r[k] for r in runs) for k in keys} for tree, runs in by_tree.items()}
        for tree in trees:
            figures = "  ".join(f"{k}={medians[tree][k]:.3g}" for k in keys)
            out.append(f"{row:<16} {tree:<8} {figures}  {strace.get((row, tree), '')}")
        if len(trees) == 2:
            ratios = "  ".join(f"{k}={medians['after'][k] / (medians['before'][k] or 1):.2f}x" for k in keys[:5])
            out.append(f"{row:<16} {'ratio':<8} {ratios}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--latency-ms", type=float, default=300)
    parser.add_argument("--turns", type=int, default=1, help="tool-calling turns a prompt (then its answer)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--n-samples", type=int, default=1)
    parser.add_argument("--executor", choices=("pool", "ray"), default="pool")
    parser.add_argument("--environments", default="local,bwrap", help="comma-separated --environment values")
    parser.add_argument("--verify", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baseline", type=Path, help="another checkout, run alternating with this one")
    parser.add_argument("--strace", type=int, default=0, help="prompts of the strace run per row (0: none)")
    parser.add_argument("--export", default="", help="--export of the runs (written in the merge's pass)")
    parser.add_argument("--json", action="store_true", help="every run's figures as JSON lines too")
    args = parser.parse_args()
    trees = {"after": ROOT, **({"before": args.baseline.resolve()} if args.baseline else {})}
    verifies = {"no": [False], "yes": [True], "both": [False, True]}[args.verify]
    combos = [(env, verify) for env in args.environments.split(",") for verify in verifies]
    name = {combo: combo[0] + (" +verify" if combo[1] else "") for combo in combos}
    rows: dict[str, dict[str, list[dict]]] = {name[c]: {t: [] for t in trees} for c in combos}
    strace: dict = {}
    print(f"load before: {os.getloadavg()}", flush=True)
    server, base_url = start_server(args.latency_ms / 1000, args.turns)
    try:
        for repeat in range(args.repeats):
            for combo in combos:
                for label, tree in trees.items() if repeat % 2 == 0 else reversed(trees.items()):
                    figures = run_once(tree, base_url, args, *combo)
                    rows[name[combo]][label].append(figures)
                    if args.json:
                        print(json.dumps({"row": name[combo], "tree": label, **figures}), flush=True)
        if args.strace and shutil.which("strace"):
            for combo in combos:
                for label, tree in trees.items():
                    counts = strace_counts(tree, base_url, args, *combo)
                    strace[(name[combo], label)] = "  ".join(f"{k}={v:.3g}" for k, v in counts.items())
    finally:
        server.kill()
        server.wait()
    print(f"load after: {os.getloadavg()}  ({os.cpu_count()} cores)")
    samples = args.prompts * args.n_samples
    shape = f"{args.workers} workers x {args.concurrency}, {args.latency_ms:g} ms a call, {args.turns} tool turns"
    print(f"{samples} samples, {shape}; medians of {args.repeats}")
    print(table(rows, list(trees), strace))


if __name__ == "__main__":
    main()
