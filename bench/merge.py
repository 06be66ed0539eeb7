"""Merge and resume scan of a large run folder: time and peak memory.

    python bench/merge.py --trajectories 100000

Synthesises a run folder of N trajectories (about 2 KB each, in batch files of 1,000) and a matching
dataset, then times, each in a fresh process: the resume scan (content matching against the
dataset), the merge into trajectories.jsonl, and a whole `batch_runner.py --resume` of the finished
folder (which scans, merges and writes statistics without calling any model).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
BATCH = 1000

PHASE = """
import resource, sys, time
from pathlib import Path
from trajforge.tools import registry
from trajforge.run.samples import plan_samples
from collections import Counter
from trajforge.run.dataset import load_dataset
from trajforge.runfolder.merge import merge
from trajforge.runfolder.folder import RunFolder, sample_key
folder = RunFolder(Path({folder!r}))
started = time.perf_counter()
if {phase!r} == "scan":
    entries = load_dataset(Path({dataset!r}))
    finished = Counter(sample_key(r) for _, r in folder.batch_lines(print))
    plan = plan_samples(entries, finished, Counter())
    assert not plan.pending and len(plan.done) == len(entries)
else:
    totals = merge(folder, True, sorted(registry.TOOLS), print)
    assert totals.trajectories == {count}
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def synthesise(folder: Path, dataset: Path, count: int) -> None:
    folder.mkdir(parents=True)
    filler = "Here is the implementation with an explanation of each step. " * 12
    with open(dataset, "wb") as prompts:
        for batch_num in range(0, count, BATCH):
            lines = []
            for index in range(batch_num, min(batch_num + BATCH, count)):
                prompt = f"benchmark prompt number {index}: write and test a small function"
                prompts.write(orjson.dumps({"prompt": prompt}) + b"\n")
                record = {
                    "prompt_index": index,
                    "conversations": [
                        {"from": "system", "value": "<tools>[]</tools>"},
                        {"from": "human", "value": prompt},
                        {"from": "gpt", "value": f"<think>\nplan {index}\n</think>\n{filler}"},
                        {"from": "gpt", "value": f"<think>\n\n</think>\n{filler}"},
                    ],
                    "metadata": {
                        "batch_num": batch_num // BATCH,
                        "timestamp": "2026-11-30T00:00:00+00:00",
                        "model": "bench",
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": 0.0},
                        "source": json.dumps({"prompt": prompt}),
                    },
                    "completed": True,
                    "partial": False,
                    "api_calls": 2,
                    "toolsets_used": ["terminal"],
                    "tool_stats": {"terminal": {"count": 1, "success": 1, "failure": 0}},
                    "tool_error_counts": {"terminal": 0},
                }
                lines.append(orjson.dumps(record) + b"\n")
            (folder / f"batch_{batch_num // BATCH}.jsonl").write_bytes(b"".join(lines))


def phase(name: str, folder: Path, dataset: Path, count: int) -> tuple[float, float]:
    code = PHASE.format(folder=str(folder), dataset=str(dataset), phase=name, count=count)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    seconds, rss = out.split()[-2:]
    return float(seconds), float(rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, dataset = Path(tmp, "bench"), Path(tmp, "prompts.jsonl")
        synthesise(folder, dataset, args.trajectories)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(
            f"run folder: {args.trajectories} trajectories, {size / 2**20:.0f} MB, "
            f"{size / args.trajectories:.0f} B each"
        )
        for name in ("scan", "merge"):
            seconds, rss = phase(name, folder, dataset, args.trajectories)
            print(f"{name:<6} {seconds:6.2f} s   peak RSS {rss:6.1f} MB")
        command = [
            sys.executable,
            str(ROOT / "batch_runner.py"),
            f"--dataset_file={dataset}",
            "--batch_size=1000",
            "--run_name=bench",
            f"--output_dir={tmp}",
            "--model=mock",
            "--resume",
        ]
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - started
        assert proc.returncode == 0, proc.stdout + proc.stderr
        written = (folder / "trajectories.jsonl").read_bytes().count(b"\n")
        stats = json.loads((folder / "statistics.json").read_text())
        print(
            f"--resume of the finished folder: {wall:.2f} s wall, {written} trajectories, "
            f"{stats['trajectories']} in stats"
        )


if __name__ == "__main__":
    main()
