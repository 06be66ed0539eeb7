"""Merge and resume scan of a large run folder: time and peak memory.

    python bench/merge.py --trajectories 100000
    python bench/merge.py --trajectories 10000 --lines-from RUN_FOLDER --against OTHER_CHECKOUT --repeats 5

Synthesises a run folder of N trajectories (about 2 KB each, in batch files of 1,000) and a matching
dataset, then times, each in a fresh process: the resume scan (content matching against the
dataset), the merge into trajectories.jsonl, and a whole `batch_runner.py --resume` of the finished
folder (which scans, merges and writes statistics without calling any model).

`--lines-from` takes the batch lines of a real run folder instead (cycled to N), and times the merge
alone; with `--journal`, this checkout first journals the same samples as it writes them (a folder made
by an older main holds version-1 lines). `--against` times the merge of a second checkout too, on the
lines as they are, alternating the two `--repeats` times in one session, and prints the ratio of their
medians: `--lines-from` a folder of that older main, `--journal` and `--against` its checkout compare
the two versions on the same samples, each merging what it writes. With `--dataset` (that folder's), a
whole `batch_runner.py --resume --export=...` of each is timed too: the merge, the exports and the report.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
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
try:  # the registry (main since the plugins), else the table it replaced (an older --baseline tree)
    from trajforge import plugins
    from trajforge.tools.toolsets import every_tool
    plugins.load()
    tool_names = sorted(every_tool())
except ImportError:
    from trajforge.tools import registry
    tool_names = sorted(registry.TOOLS)
from trajforge.run.samples import plan_samples
from collections import Counter
from trajforge.run.dataset import load_dataset
from trajforge.runfolder.merge import merge
from trajforge.runfolder.folder import RunFolder, sample_key
folder = RunFolder(Path({folder!r}))
started, cpu = time.perf_counter(), time.process_time()
if {phase!r} == "scan":
    entries = load_dataset(Path({dataset!r}))
    finished = Counter(sample_key(r) for _, r in folder.batch_lines(print))
    plan = plan_samples(entries, finished, Counter())
    assert not plan.pending and len(plan.done) == len(entries)
else:
    totals = merge(folder, True, tool_names, print)
    assert totals.trajectories == {count}
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(time.process_time() - cpu, time.perf_counter() - started, peak)
"""


JOURNAL = """
import sys
from dataclasses import replace
from pathlib import Path
import orjson
from trajforge import journal
for path in sorted(Path(sys.argv[1]).glob("batch_*.jsonl")):
    lines = path.read_bytes().splitlines(True)
    samples = (replace(journal.read(orjson.loads(line), line), legacy=None, legacy_line=None) for line in lines)
    path.write_bytes(b"".join(sample.journal() for sample in samples))
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


def cycled(source: Path, folder: Path, count: int) -> int:
    """A run folder of `count` lines cycled from the batch files of `source`; how many it keeps (the lines
    the merge writes to trajectories.jsonl: not discarded)."""
    lines = [line for path in sorted(source.glob("batch_*.jsonl")) for line in path.read_bytes().splitlines(True)]
    folder.mkdir(parents=True)
    kept = 0
    for start in range(0, count, BATCH):
        chunk = [lines[i % len(lines)] for i in range(start, min(start + BATCH, count))]
        kept += sum(b'"discarded":' not in line for line in chunk)
        (folder / f"batch_{start // BATCH}.jsonl").write_bytes(b"".join(chunk))
    return kept


def phase(name: str, folder: Path, dataset: Path, count: int, tree: Path = ROOT) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, peak RSS in MB) of one phase in a fresh process."""
    code = PHASE.format(folder=str(folder), dataset=str(dataset), phase=name, count=count)
    command = [sys.executable, "-c", code]
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=tree, env=_env(tree)).stdout
    cpu, seconds, rss = out.split()[-3:]
    return float(cpu), float(seconds), float(rss)


def _env(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree)}  # that checkout's package, not the installed one


def compare(args: argparse.Namespace) -> None:
    """The merge's CPU time in this checkout and in `--against`, alternating, each on its own version's
    lines (CPU rather than wall time: the machine is shared)."""
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = Path(tmp, "ours"), Path(tmp, "theirs")
        kept = cycled(args.lines_from, ours, args.trajectories)
        assert cycled(args.lines_from, theirs, args.trajectories) == kept
        if args.journal:
            subprocess.run([sys.executable, "-c", JOURNAL, str(ours)], check=True, cwd=ROOT, env=_env(ROOT))
        trees = (("this", ROOT, ours), ("against", args.against, theirs))
        merges: dict[str, list[float]] = {"this": [], "against": []}
        resumes: dict[str, list[float]] = {"this": [], "against": []}
        for _ in range(args.repeats):
            for name, tree, folder in trees:
                merges[name].append(phase("merge", folder, Path(tmp, "unused"), kept, tree)[0])
                if args.dataset:
                    resumes[name].append(resume_cpu(tree, folder, args.dataset, args.export))
        report("merge", merges)
        if args.dataset:
            report(f"--resume --export={args.export} (the whole process: merge, exports, report)", resumes)


def report(what: str, times: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{what} CPU ({name}) median {medians[name]:.3f} s of {', '.join(f'{v:.3f}' for v in values)}")
    print(f"{what}: ratio this/against {medians['this'] / medians['against']:.3f}")


def resume_cpu(tree: Path, folder: Path, dataset: Path, exports: str) -> float:
    """CPU seconds of a `batch_runner.py --resume` of the finished folder in `tree` (no model is called)."""
    command = [sys.executable, "batch_runner.py", f"--dataset_file={dataset.resolve()}", f"--run_name={folder.name}"]
    command += [
        f"--output_dir={folder.parent}",
        "--model=mock",
        "--resume",
        f"--export={exports}",
        f"--batch_size={BATCH}",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(command, capture_output=True, text=True, cwd=tree, env=_env(tree))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--lines-from", type=Path, help="a run folder whose batch lines to cycle")
    parser.add_argument("--against", type=Path, help="another checkout whose merge to time too")
    parser.add_argument("--journal", action="store_true", help="journal the lines as this checkout writes them")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dataset", type=Path, help="the dataset of --lines-from: also time a whole --resume")
    parser.add_argument("--export", default="openai,llamafactory,atif", help="what that --resume exports")
    args = parser.parse_args()
    if args.against:
        compare(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder, dataset = Path(tmp, "bench"), Path(tmp, "prompts.jsonl")
        synthesise(folder, dataset, args.trajectories)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(
            f"run folder: {args.trajectories} trajectories, {size / 2**20:.0f} MB, "
            f"{size / args.trajectories:.0f} B each"
        )
        for name in ("scan", "merge"):
            _, seconds, rss = phase(name, folder, dataset, args.trajectories)
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
