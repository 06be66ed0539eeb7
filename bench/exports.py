"""The report and each export on a large run folder: time and file size (a benchmark, not a test).

    python bench/exports.py --trajectories 10000 [--load]

Synthesises a run folder of N samples journalled as the worker does (1 to 6 assistant turns,
1 to 3 parallel calls per turn, tool results of 0.2 to 6 KB, reasoning in most turns; 5% dropped for
want of reasoning, 10% partial, 1% failed prompts in errors.jsonl), merges it, then times each step
of the publication separately: the report's collection during the merge (the merge with and without
it), the report page, each export format during the merge (beside the merge alone), and the dataset
card. With --load, each export is also loaded with `datasets.load_dataset` (offline), which checks its
schema at that size.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson

from batch_runner import main
from trajectory import ToolCall, Turn, discard_reason, record_usage, tool_stats
from trajforge import plugins, registry
from trajforge.cli.config import build_config
from trajforge.export import card
from trajforge.export.publish import Exports
from trajforge.export.report import ReportData, write_report
from trajforge.journal.sample import Sample, now
from trajforge.runfolder.folder import RunFolder
from trajforge.runfolder.merge import merge
from trajforge.tools.toolsets import every_tool
from trajforge.verification.result import unverified
from trajforge.version import git_commit

BATCH = 500
WORDS = ("the", "agent", "reads", "a", "file", "runs", "tests", "and", "fixes", "an", "import", "then", "answers")


def text(rng: random.Random, size: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(size // 5))


def call(rng: random.Random, turn: int, index: int) -> ToolCall:
    name = rng.choice(["terminal", "read_file", "write_file", "web_extract", "search_files"])
    arguments = {"terminal": {"command": "pytest -q tests/"}, "read_file": {"path": "src/app.py"}}.get(
        name, {"path": "notes.txt", "content": text(rng, 300)}
    )
    result = {"output": text(rng, rng.randint(200, 6000)), "exit_code": rng.choice([0, 0, 0, 1])}
    if rng.random() < 0.05:
        result = {"error": "file not found: src/missing.py"}
    return ToolCall(f"call_{turn}_{index}", name, json.dumps(arguments), result)


def synthesise(folder: RunFolder, count: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    folder.path.mkdir(parents=True)
    functions = [every_tool()[name].schema["function"] for name in sorted(every_tool())]
    names = sorted(every_tool())
    errors = []
    for start in range(0, count, BATCH):
        lines = []
        for index in range(start, min(start + BATCH, count)):
            prompt = f"Task {index}: " + text(rng, rng.randint(60, 600))
            if rng.random() < 0.01:
                error = {"prompt_index": index, "error_type": "api_timeout", "message": "timed out", "attempts": 7}
                errors.append({**error, "source": {"prompt": prompt}})
                continue
            silent = rng.random() < 0.05
            steps = rng.randint(1, 6)
            turns = [
                Turn(
                    text(rng, rng.randint(0, 300)),
                    "" if silent or rng.random() < 0.1 else text(rng, rng.randint(100, 1500)),
                    [call(rng, t, i) for i in range(rng.randint(1, 3))] if t < steps - 1 else [],
                )
                for t in range(steps)
            ]
            exit_reason = "max_turns" if rng.random() < 0.1 else "completed"
            sample = Sample(
                prompt_index=index,
                sample_index=0,
                batch_num=start // BATCH,
                entry={"prompt": prompt, "id": f"task-{index}"},
                tools=functions,
                toolsets=["file", "terminal", "web"],
                turns=turns,
                api_calls=steps,
                exit_reason=exit_reason,
                usage=record_usage(
                    {
                        "prompt_tokens": 4000 * steps,
                        "completion_tokens": 300 * steps,
                        "total_tokens": 4300 * steps,
                        "reasoning_tokens": 120 * steps,
                        "cached_tokens": 0,
                        "cost": 0.002 * steps,
                    }
                ),
                verification=unverified(),
                tool_stats=tool_stats(turns, names)[0],
                model="bench-model",
                model_reported="",
                run_name="bench",
                duration_seconds=round(rng.uniform(2, 120), 2),
                timestamp=now(),
                token_drift="[]",
                discarded=discard_reason(turns, set(names)),
            )
            lines.append(sample.journal())
        folder.batch_file(start // BATCH).write_bytes(b"".join(lines))
    folder.errors.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in errors))


def timed(label: str, work):
    """work(), printing how long it took: wall and CPU time (on a shared machine, the CPU time is the steadier)."""
    started, cpu = time.perf_counter(), time.process_time()
    result = work()
    print(f"{label:<38} {time.perf_counter() - started:7.2f} s wall {time.process_time() - cpu:7.2f} s CPU")
    return result


def size(path: Path) -> str:
    return f"{path.stat().st_size / 2**20:8.1f} MB"


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--load", action="store_true", help="also load each export with datasets")
    args = parser.parse_args()
    plugins.load()  # the built-in tools and formats, as a run registers them
    with tempfile.TemporaryDirectory() as tmp:
        folder = RunFolder(Path(tmp, "bench"))
        synthesise(folder, args.trajectories)
        batches = sum(path.stat().st_size for _, path in folder.batch_files())
        print(f"run folder: {args.trajectories} prompts, batch files {batches / 2**20:.1f} MB")
        tools = sorted(every_tool())
        timed("merge alone", lambda: merge(folder, True, tools, print))
        collected = ReportData(2000)
        totals = timed(
            "merge + report collection", lambda: merge(folder, True, tools, print, observe=collected.observe)
        )
        print(f"trajectories.jsonl: {totals.trajectories} trajectories, {size(folder.trajectories)}")
        stats = {
            "run_name": "bench",
            "model": "bench-model",
            "trajectories": totals.trajectories,
            "tool_statistics": totals.tool_statistics,
            "usage": totals.usage,
            "reasoning_statistics": totals.reasoning_statistics,
        }
        timed("report page", lambda: write_report(folder, stats, collected, Counter(totals.finished)))
        print(f"{'report.html':<38} {size(folder.path / 'report.html')} ({len(collected.trajectories())} embedded)")
        for name in registry.EXPORTS.names():
            exports = Exports(folder, (name,), "bench")
            timed(
                f"merge + export {name}",
                lambda exports=exports: merge(folder, True, tools, print, written=exports.write),
            )
            exports.commit()
        flags = {name: p.default for name, p in inspect.signature(main).parameters.items()}
        flags.update(dataset_file="x", batch_size=1, run_name="bench", model="mock")
        config = build_config(flags)
        timed("dataset card", lambda: card.render(stats, card.shaping_flags(config), {}, "x", git_commit()))
        for path in sorted((folder.path / "export").iterdir()):
            print(f"{'export/' + path.name:<38} {size(path)}")
        if args.load:
            for path in sorted((folder.path / "export").glob("[!d]*")):  # not dataset_info.json
                rows = timed(f"datasets.load_dataset {path.name}", lambda path=path: load(path, tmp))
                assert len(rows) == totals.trajectories, path


def load(path: Path, tmp: str):
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets

    from trajforge.export.loading import features

    builder = "parquet" if path.suffix == ".parquet" else "json"
    # openai.jsonl: over 10 MB, datasets types each chunk on its own; its features keep them one type.
    typed = {"features": features("openai")} if path.name == "openai.jsonl" else {}
    return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(Path(tmp, "hf")), **typed)


if __name__ == "__main__":
    main_bench()
