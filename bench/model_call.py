"""CPU of one model call in a worker, against the scripted server answering at once:

    python bench/model_call.py --calls 2000 --concurrency 50 --repeats 3 [--baseline DIR]

Starts the mock server (trajforge.mock.server, no latency) and, in a fresh process per measurement,
makes --calls chat calls through ChatModel.complete (the request body, the money wrapper, the client,
the retries) with --concurrency in flight, each for its own sample so that none is a response cache
hit. Two rows: `unmetered` (the client alone) and `ledger` (the run's money database too: the cache,
the budget and the adaptive concurrency limit, LocalLedger in a temporary run folder). Printed per
row: the process's CPU ms per call (the server excluded, the first --warmup calls excluded), and with
--baseline DIR (another checkout, e.g. `git worktree add --detach DIR main`) the same for that tree,
alternating with this one, and the ratio of the medians after/before.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CALLS = """
import asyncio, sys, time
from trajforge.caller import Caller
from trajforge.model.chat import ChatModel
from trajforge.model.settings import ModelSettings
from trajforge.money.spending import UNMETERED, MoneySettings, Spending

url, folder, calls, concurrency, warmup = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])

async def measured():
    money = Spending(MoneySettings(folder=folder, start=concurrency)) if folder else UNMETERED
    model = ChatModel(ModelSettings(model="bench", base_url=url, api_key="k"), money)
    tools = [{"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}]

    async def calls_from(indexes):
        for index in indexes:
            messages = [{"role": "user", "content": f"benchmark prompt {index}: list the files"}]
            await model.complete(messages, tools, Caller(scope=f"s{index}"))

    async def batch(start, count):
        indexes = iter(range(start, start + count))
        await asyncio.gather(*(calls_from(indexes) for _ in range(concurrency)))

    await batch(0, warmup)
    cpu = time.process_time()
    await batch(warmup, calls)
    spent = time.process_time() - cpu
    await model.close()
    if money is not UNMETERED:
        await money.close()
    print(spent * 1000 / calls)

asyncio.run(measured())
"""


def start_server() -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "trajforge.mock.server", "--latency", "0", "--turns", "1"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    return server, server.stdout.readline().strip().split("=", 1)[1]


def measure(tree: Path, url: str, ledger: bool, args: argparse.Namespace) -> float:
    """CPU ms per call of one fresh process running `tree`'s code."""
    sizes = (args.calls, args.concurrency, args.warmup)
    with tempfile.TemporaryDirectory() as folder:
        out = subprocess.run(
            [sys.executable, "-c", CALLS, url, folder if ledger else "", *map(str, sizes)],
            cwd=tree,
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout, run alternating with this one")
    args = parser.parse_args()
    trees = {"after": ROOT, **({"before": args.baseline.resolve()} if args.baseline else {})}
    server, url = start_server()
    try:
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for row, ledger in (("unmetered", False), ("ledger", True)):
                for name, tree in trees.items():
                    results.setdefault((row, name), []).append(measure(tree, url, ledger, args))
    finally:
        server.terminate()
        server.wait()
    print(f"{args.calls} calls, {args.concurrency} in flight, medians of {args.repeats} (CPU ms per call)")
    for row in ("unmetered", "ledger"):
        after = statistics.median(results[(row, "after")])
        line = f"{row:10} after {after:6.3f}"
        if args.baseline:
            before = statistics.median(results[(row, "before")])
            line += f"  before {before:6.3f}  ratio {after / before:.2f}"
        print(line)


if __name__ == "__main__":
    main()
