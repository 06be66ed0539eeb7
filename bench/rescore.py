"""What a re-scoring's replay costs per sample, beside the agent's run of the same sample without model
latency (the scripted model answers at once).

    python bench/rescore.py --samples 48 --environment bwrap

Invocations of batch_runner.py on the same run folder, each timed from outside: the run itself
(--model=mock, terminal_only: three model calls and three tool calls per sample), a --resume with
nothing left to do (three times, the median: an invocation's fixed cost of start-up, plan, merge and
report), and --rescore with a `verify` command added to the dataset, which needs the workspace and so
replays each sample's terminal and file calls in a fresh environment. Per sample: (invocation - fixed
cost) / samples; the ratio is replay over run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def invocation(dataset: Path, out: Path, environment: str, *flags: str) -> float:
    command = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--run_name=bench"]
    command += [f"--output_dir={out}", "--model=mock", "--distribution=terminal_only", f"--environment={environment}"]
    command += ["--batch_size=8", "--num_workers=2", "--report=false", *flags]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{' '.join(flags)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--environment", default="local")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-rescore-"))
    entries = [{"prompt": f"bench task {i}"} for i in range(args.samples)]
    dataset = folder / "prompts.jsonl"
    dataset.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    out = folder / "out"
    run = invocation(dataset, out, args.environment)
    fixed = statistics.median(invocation(dataset, out, args.environment, "--resume") for _ in range(3))
    dataset.write_text("".join(json.dumps(entry | {"verify": "test -f notes.txt"}) + "\n" for entry in entries))
    replay = invocation(dataset, out, args.environment, "--resume", "--rescore")
    per_run, per_replay = ((seconds - fixed) / args.samples for seconds in (run, replay))
    print(f"{args.samples} samples, --environment={args.environment}, fixed cost of an invocation {fixed:.2f} s")
    print(f"agent's run (no model latency): {per_run * 1000:.0f} ms per sample")
    print(f"re-scoring with replay:         {per_replay * 1000:.0f} ms per sample")
    print(f"ratio replay / run: {per_replay / per_run:.2f}")
    stats = json.loads((out / "bench" / "statistics.json").read_text())
    passed, verified = stats["verification"]["passed"], stats["verification"]["verified_samples"]
    print(f"replayed samples passing their new check: {passed} of {verified}; diverged: {stats['replay_diverged']}")


if __name__ == "__main__":
    main()
