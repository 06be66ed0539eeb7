"""Adaptive concurrency against a provider's concurrency limit (issue 37), three runs of one dataset:

    python bench/adaptive.py --prompts 200 --limit 5 --latency-ms 250

The scripted server (trajforge.mock.server, in this process) answers 429 with `Retry-After: 1` to a
chat request beyond `--limit` in flight. The same prompts run at --num_workers=2 --concurrency=25
with --adaptive_concurrency (on), without it (fixed), and at --concurrency=3 (about the server's
limit: the well-sized run). Printed per run: wall time, prompts that finished, requests and 429s,
the opening burst (requests that arrived before the first answer) and the 429s after it as a share
of all requests; then the ratios of the adaptive run to the others.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trajforge.mock.server import MockServer  # noqa: E402

RUNS = (("adaptive", 25, True), ("fixed", 25, False), ("well-sized", 3, False))


def one_run(name: str, concurrency: int, adaptive: bool, args: argparse.Namespace, tmp: Path) -> dict:
    server = MockServer(latency=args.latency_ms / 1000, turns=0)
    server.max_in_flight, server.busy_retry_after = args.limit, 1.0
    base_url = server.start()
    dataset = tmp / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"adaptive bench {i}"}) + "\n" for i in range(args.prompts)))
    command = [
        sys.executable,
        str(ROOT / "batch_runner.py"),
        f"--dataset_file={dataset}",
        "--batch_size=20",
        f"--run_name={name}",
        f"--output_dir={tmp}",
        "--model=bench",
        f"--base_url={base_url}",
        "--api_key=bench",
        "--distribution=terminal_only",
        "--num_workers=2",
        f"--concurrency={concurrency}",
        f"--adaptive_concurrency={adaptive}",
        f"--max_retries={args.max_retries}",
    ]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    server.stop()
    stats = json.loads((tmp / name / "statistics.json").read_text())
    chat = server.chat_requests()
    first_answer = min(r["at"] for r in chat if r["status"] == 200) + args.latency_ms / 1000
    burst = [r for r in chat if r["at"] < first_answer]
    refused = sum(r["status"] == 429 for r in chat)
    later = refused - sum(r["status"] == 429 for r in burst)
    return {
        "run": name,
        "exit": proc.returncode,
        "wall_s": round(wall, 2),
        "finished": stats["completed"] + stats["partial"],
        "failed": stats["failed"],
        "requests": len(chat),
        "429s": refused,
        "429_share": round(refused / len(chat), 3),
        "burst": len(burst),
        "429s_after_burst_share": round(later / len(chat), 3),
        "concurrency": stats["concurrency"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--limit", type=int, default=5, help="the server's requests in flight before 429")
    parser.add_argument("--latency-ms", type=float, default=250)
    parser.add_argument("--max-retries", type=int, default=6, help="the runner's --max_retries")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, concurrency, adaptive in RUNS:
            results[name] = one_run(name, concurrency, adaptive, args, Path(tmp))
            print(json.dumps(results[name]), flush=True)
    on, off, sized = results["adaptive"], results["fixed"], results["well-sized"]
    print(f"wall adaptive/well-sized  {on['wall_s'] / sized['wall_s']:.2f}")
    print(f"wall adaptive/fixed       {on['wall_s'] / off['wall_s']:.2f}")
    print(f"429s adaptive/fixed       {on['429s'] / max(off['429s'], 1):.3f}")
    print(f"429s adaptive/well-sized  {on['429s'] / max(sized['429s'], 1):.3f}")


if __name__ == "__main__":
    main()
