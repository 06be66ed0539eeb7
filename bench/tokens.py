"""What --token_ids costs: the size of tokens.jsonl per trajectory and the runner's CPU per turn, as ratios
against a plain run of the same prompts (a benchmark, not a test).

    python bench/tokens.py --prompts 60

Starts the scripted server as a subprocess (its CPU is not counted: it plays vLLM, whose cost is the
server's), then runs batch_runner.py on the same prompts four times: plain and with --token_ids, each
with N prompts and with one (the one-prompt run measures start-up, imports and merge, which the
per-turn figure leaves out). The runner's CPU is its whole process tree (workers and terminal commands).
The mock's tokenizer makes one token per UTF-8 byte; a real BPE tokenizer makes about one per 4 bytes,
so real tokens.jsonl files are about a quarter of these per trajectory (the ratio printed per token
holds for both).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--distribution=terminal_only", "--environment=local", "--num_workers=1", "--concurrency=4"]


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(base_url: str, folder: Path, prompts: int, name: str, extra: list[str]) -> dict:
    dataset = folder / f"{name}.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"take notes {i}"}) + "\n" for i in range(prompts)))
    command = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=10"]
    command += [f"--run_name={name}", f"--output_dir={folder}", f"--base_url={base_url}", "--model=bench"]
    before = cpu()
    subprocess.run([*command, "--api_key=bench", *FLAGS, *extra], check=True, capture_output=True, cwd=folder)
    spent = cpu() - before
    run_dir = folder / name
    lines = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    tokens = run_dir / "tokens.jsonl"
    ids = [json.loads(line) for line in tokens.read_text().splitlines()] if tokens.exists() else []
    return {
        "cpu": spent,
        "turns": sum(record["api_calls"] for record in lines),
        "trajectories": len(lines),
        "trajectories_bytes": (run_dir / "trajectories.jsonl").stat().st_size,
        "tokens_bytes": tokens.stat().st_size if tokens.exists() else 0,
        "token_count": sum(len(t["prompt_token_ids"]) + len(t["token_ids"]) for line in ids for t in line["turns"]),
        "completion_tokens": sum(len(t["token_ids"]) for line in ids for t in line["turns"]),
    }


def measure(prompts: int) -> dict:
    server = subprocess.Popen([sys.executable, "-m", "trajforge.mock.server"], stdout=subprocess.PIPE, text=True)
    base_url = server.stdout.readline().strip().split("=", 1)[1]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            runs = {}
            for mode, extra in (("plain", []), ("token_ids", ["--token_ids"])):
                runs[mode] = one_run(base_url, folder, prompts, mode, extra)
                runs[f"{mode}_1"] = one_run(base_url, folder, 1, f"{mode}_1", extra)
            return runs
    finally:
        server.terminate()
        server.wait()


def report(runs: dict) -> dict:
    def per_turn(mode: str) -> float:
        many, one = runs[mode], runs[f"{mode}_1"]
        return (many["cpu"] - one["cpu"]) / (many["turns"] - one["turns"])

    plain, tokens = runs["plain"], runs["token_ids"]
    size = tokens["tokens_bytes"] / tokens["trajectories"]
    plain_size = plain["trajectories_bytes"] / plain["trajectories"]
    return {
        "turns": tokens["turns"],
        "trajectories": tokens["trajectories"],
        "cpu_ms_per_turn_plain": round(1000 * per_turn("plain"), 2),
        "cpu_ms_per_turn_token_ids": round(1000 * per_turn("token_ids"), 2),
        "cpu_per_turn_ratio": round(per_turn("token_ids") / per_turn("plain"), 3),
        "cpu_whole_run_ratio": round(tokens["cpu"] / plain["cpu"], 3),
        "trajectories_jsonl_bytes_per_trajectory_plain": plain["trajectories_bytes"] // plain["trajectories"],
        "trajectories_jsonl_bytes_per_trajectory_token_ids": tokens["trajectories_bytes"] // tokens["trajectories"],
        "tokens_jsonl_bytes_per_trajectory": int(size),
        "tokens_jsonl_to_trajectories_jsonl_ratio": round(size / plain_size, 3),
        "tokens_jsonl_bytes_per_token": round(tokens["tokens_bytes"] / tokens["token_count"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=60)
    args = parser.parse_args()
    print(json.dumps(report(measure(args.prompts)), indent=2))


if __name__ == "__main__":
    main()
