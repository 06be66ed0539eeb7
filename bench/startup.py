"""What a start of batch_runner.py costs that ends before any model call: --help, a refused flag and a refused
dataset (each exits before the runner is imported), as the median wall time of `repeats` starts, and which
heavy packages each start imported.

    python bench/startup.py --repeats 7
    python bench/startup.py --repeats 7 --checkout /path/to/another/checkout   # the same starts of its code

The suite starts batch_runner.py a hundred times and more on such paths (argument checks, bad input).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("openai", "httpx", "aiohttp", "pydantic", "playwright", "ray", "mcp", "docker", "tenacity")
# Prints, at exit, which of HEAVY the start imported (the exit is sys.exit, so atexit runs).
PROBE = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('imported:', ' '.join(n for n in {heavy!r} if n in sys.modules) or '-',"
    " file=sys.stderr))\n"
    "sys.argv = [{script!r}, *sys.argv[1:]]\n"
    "runpy.run_path({script!r}, run_name='__main__')\n"
)


def starts(folder: str) -> dict[str, list[str]]:
    """The arguments of each start; its outputs, had it any, would go to `folder`."""
    run = ["--run_name=x", "--model=mock", f"--output_dir={folder}"]
    return {
        "--help": ["--help"],
        "a refused flag": ["--dataset_file=x.jsonl", "--batch_size=0", *run],
        "a refused dataset": [f"--dataset_file={Path(folder) / 'absent.jsonl'}", "--batch_size=1", *run],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--checkout", default=str(Path(__file__).resolve().parents[1]))
    args = parser.parse_args()
    checkout = Path(args.checkout).resolve()
    script = str(checkout / "batch_runner.py")
    with tempfile.TemporaryDirectory() as folder:
        for name, argv in starts(folder).items():
            command = [sys.executable, script, *argv]
            times = []
            for _ in range(args.repeats):
                began = time.perf_counter()
                done = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
                times.append(time.perf_counter() - began)
            probe = PROBE.format(heavy=HEAVY, script=script)
            seen = subprocess.run([sys.executable, "-c", probe, *argv], cwd=checkout, capture_output=True, text=True)
            imported = next(line for line in seen.stderr.splitlines() if line.startswith("imported:"))
            print(
                f"{name:18} exit {done.returncode}  median {statistics.median(times) * 1000:6.0f} ms  "
                f"min {min(times) * 1000:6.0f} ms  {imported}"
            )


if __name__ == "__main__":
    main()
