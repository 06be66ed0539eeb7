"""How the runner's costs grow with the number of samples, in one run:

    python bench/scale.py --sizes 1000,10000 [--environment local] [--latency-ms 300]

Two workloads at each size (a number of samples), smallest first, against one scripted server (two
model calls and one terminal command a sample; bench/throughput.py runs each): `prompts`, as many
prompts as samples, and `n_samples=4+verify`, a quarter as many prompts run 4 times each with a
`verify` command. Per run: the runner's CPU per sample (its whole process tree), the wall time, the
peak RSS of the parent and of the largest worker, the merge (from the last worker's exit to
trajectories.jsonl) and the end of the run (from the last batch line to the exit). Then, per
workload, each figure at the largest size over the smallest, and the exponent k of its growth
(figure ~ samples^k): CPU per sample within 1.2x is the target, and a total that grows faster than
the number of samples shows as k > 1.
"""

from __future__ import annotations

import argparse
import math
import os

from throughput import ROOT, run_once, start_server  # the sibling script: `python bench/scale.py` finds it

WORKLOADS = {"prompts": (1, False), "n_samples=4+verify": (4, True)}  # name -> (samples per prompt, verify)
FIGURES = ("cpu_ms", "sys_ms", "wall_s", "merge_s", "end_s", "parent_rss_mb", "worker_rss_mb")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated numbers of samples")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"some of {', '.join(WORKLOADS)}")
    parser.add_argument("--environment", default="local")
    parser.add_argument("--latency-ms", type=float, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--turns", type=int, default=1, help="tool turns a sample (throughput.py's)")
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.sizes.split(","))
    print(f"load before: {os.getloadavg()}  ({os.cpu_count()} cores)", flush=True)
    server, base_url = start_server(args.latency_ms / 1000, args.turns)
    results: dict[str, dict[int, dict]] = {}
    try:
        for name in args.workloads.split(","):
            per_prompt, verify = WORKLOADS[name]
            for size in sizes:
                run = argparse.Namespace(
                    **vars(args), prompts=size // per_prompt, n_samples=per_prompt, executor="pool", export=""
                )
                figures = run_once(ROOT, base_url, run, args.environment, verify)
                results.setdefault(name, {})[size] = figures
                shown = "  ".join(f"{k}={figures[k]:.3g}" for k in (*FIGURES, "trajectories"))
                print(f"{name:<20} {size:>7} samples  {shown}", flush=True)
    finally:
        server.kill()
        server.wait()
    print(f"load after: {os.getloadavg()}")
    shape = f"{args.workers} workers x {args.concurrency}, {args.latency_ms:g} ms a call"
    print(f"--environment={args.environment}, {shape}")
    small, large = sizes[0], sizes[-1]
    growth = math.log(large / small)
    for name, by_size in results.items():
        # A figure that was 0 at the small size (a merge quicker than the watcher's look) has no ratio.
        ratios = {k: by_size[large][k] / by_size[small][k] for k in FIGURES if by_size[small][k] and by_size[large][k]}
        print(f"{name:<20} {large} / {small} samples = {large / small:g}x:")
        print("   ratio  " + "  ".join(f"{k}={ratios[k]:.2f}x" if k in ratios else f"{k}=-" for k in FIGURES))
        # cpu_ms and sys_ms are per sample: their totals grow by one power of the samples' ratio more.
        exponents = {k: math.log(r) / growth + (k in ("cpu_ms", "sys_ms")) for k, r in ratios.items()}
        print("   k      " + "  ".join(f"{k}={exponents.get(k, math.nan):.2f}" for k in FIGURES if k != "wall_s"))


if __name__ == "__main__":
    main()
