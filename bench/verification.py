"""What verification costs per sample: a `verify` command and a Python `--verifier`, in each backend; and
what a task brings costs (its files and setup before the agent, its hidden tests before verification).

    python bench/verification.py --repeats 20 [--docker]

For every backend, one environment is opened, a file written (the agent's work), then each kind of
verification is timed `--repeats` times (median and max, in ms), beside one plain command for scale.
The Python verifier forks a child from this process, which runs `env.exec` and `env.read_file` through
the handle, as in a worker. A task (TASK: five small files, a setup command, one hidden test) is put in
place in a fresh environment each time. Every figure is also given as a ratio to the plain command.
--docker needs an engine with the test images (.ci/docker-up).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.tasks import prepare_task, reveal_tests
from trajforge.verifier import normalize
from trajforge.verify import VerifySettings, verify_sample

VERIFIER = """
def check(record, env):
    listing = env.exec("ls")
    return float(env.read_file("answer.txt").strip() == "42") if "answer.txt" in listing.output else 0.0
"""


async def measure(kind: str, repeats: int, verifier: str) -> dict[str, list[float]]:
    settings = EnvironmentSettings(kind=kind, default_image="batch-runner-test/alpha:1", run_dir=tempfile.mkdtemp())
    env = await backend_for(settings).open({})
    times: dict[str, list[float]] = {"plain command": [], "verify command": [], "Python verifier": []}
    try:
        await env.exec("echo 42 > answer.txt")
        entry = {"prompt": "p", "verify": 'test "$(cat answer.txt)" = 42'}
        record = {"prompt_index": 0, "metadata": {"source": entry}}
        for _ in range(repeats):
            started = time.perf_counter()
            await env.exec("true")
            times["plain command"].append(time.perf_counter() - started)
            for label, verify in (
                ("verify command", VerifySettings()),
                ("Python verifier", VerifySettings(verifier=verifier)),
            ):
                started = time.perf_counter()
                done = await verify_sample(verify, entry, record, [], env)
                times[label].append(time.perf_counter() - started)
                assert done["passed"], done
    finally:
        await env.close()
    return times


TASK = {
    "prompt": "p",
    "files": {f"src/part{n}.txt": f"part {n}\n" * 20 for n in range(5)},
    "setup": "cat src/*.txt > all.txt",
    "tests": {"check.sh": "test -s all.txt\n"},
    "verify": 'sh "$TESTS_DIR/check.sh"',
}


async def measure_task(kind: str, repeats: int) -> dict[str, list[float]]:
    """Per sample: the files and setup (before the first model call), then the hidden tests written."""
    settings = EnvironmentSettings(kind=kind, default_image="batch-runner-test/alpha:1", run_dir=tempfile.mkdtemp())
    backend = backend_for(settings)
    times: dict[str, list[float]] = {"task files+setup": [], "task tests": []}
    for _ in range(repeats):
        env = await backend.open(TASK)
        try:
            started = time.perf_counter()
            await prepare_task(env, TASK, Path(), 60.0)
            times["task files+setup"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await reveal_tests(env, TASK, Path())
            times["task tests"].append(time.perf_counter() - started)
            assert (await env.exec(TASK["verify"])).exit_code == 0
        finally:
            await env.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--docker", action="store_true")
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp()) / "bench_verifier.py"
    path.write_text(VERIFIER)
    verifier = normalize(f"{path}:check")
    for kind in ("local", "bwrap", *(("docker",) if args.docker else ())):
        times = asyncio.run(measure(kind, args.repeats, verifier)) | asyncio.run(measure_task(kind, args.repeats))
        plain = statistics.median(times["plain command"])
        for label, values in times.items():
            ms = [1000 * v for v in values]
            ratio = statistics.median(values) / plain
            print(
                f"{kind:7} {label:16} median {statistics.median(ms):7.1f} ms   max {max(ms):7.1f} ms"
                f"   {ratio:5.1f}x a plain command"
            )


if __name__ == "__main__":
    main()
