"""What verification costs per sample: a `verify` command and a Python `--verifier`, in each backend; and
what a task brings costs (its files and setup before the agent, its hidden tests before verification).

    python bench/verification.py --repeats 20 [--docker] [--before /tmp/i22-before]

For every backend, one environment is opened, a file written (the agent's work), then each kind of
verification is timed `--repeats` times (median and max, in ms), beside one plain command for scale; and
a verify command that asks git what changed, in a workspace holding a repository of 2,000 files (not in
docker: the test images have no git).
The Python verifier forks a child from this process, which runs `env.exec` and `env.read_file` through
the handle, as in a worker. A task (TASK: five small files, a setup command, one hidden test) is put in
place in a fresh environment each time. Every figure is also given as a ratio to the plain command.
--docker needs an engine with the test images (.ci/docker-up).

--before DIR also measures the tree in DIR (e.g. `git archive main | tar -x -C DIR`) in the same run,
alternating with this one, and prints each median as a ratio after/before: the cost of the
unprivileged sandbox, the limits and the clean room.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trajforge.environments import EnvironmentSettings, backend_for

try:  # this tree's layout
    from trajforge.flags.values import verifier_spec
    from trajforge.verification.checks import verify_sample
    from trajforge.verification.result import VerifySettings
    from trajforge.verification.tasks import prepare_task, reveal_tests
except ImportError:  # a --before tree from before the package was laid out by role, and before tasks
    from trajforge.verifier import normalize
    from trajforge.verify import VerifySettings, verify_sample

    def verifier_spec(value: str, flag: str) -> str:
        return normalize(value)

    prepare_task = reveal_tests = None
try:  # where a task's folders may lie (TASK has none, its files are inline)
    from trajforge.verification.host_folders import NO_FOLDERS as FOLDERS
except ImportError:  # a tree from before: the dataset file's folder as a path
    FOLDERS = Path()

VERIFIER = """
def check(record, env):
    listing = env.exec("ls")
    return float(env.read_file("answer.txt").strip() == "42") if "answer.txt" in listing.output else 0.0
"""


async def measure(kind: str, repeats: int, verifier: str) -> dict[str, list[float]]:
    settings = EnvironmentSettings(kind=kind, default_image="batch-runner-test/alpha:1", run_dir=tempfile.mkdtemp())
    backend = backend_for(settings)
    times: dict[str, list[float]] = {"open+close": [], "plain command": [], "verify command": [], "Python verifier": []}
    for _ in range(max(1, repeats // 4)):
        started = time.perf_counter()
        await (await backend.open({})).close()
        times["open+close"].append(time.perf_counter() - started)
    env = await backend.open({})
    try:
        await env.exec("echo 42 > answer.txt")
        entry = {"prompt": "p", "verify": 'test "$(cat answer.txt)" = 42'}
        record = {"prompt_index": 0, "metadata": {"source": entry}}
        # The record is made only when a Python verifier asks for it; older trees took the record itself.
        shown = (lambda: record) if "view" in inspect.signature(verify_sample).parameters else record
        for _ in range(repeats):  # the agent's commands, before any verification
            started = time.perf_counter()
            await env.exec("true")
            times["plain command"].append(time.perf_counter() - started)
        for _ in range(repeats):
            for label, verify in (
                ("verify command", VerifySettings()),
                ("Python verifier", VerifySettings(verifier=verifier)),
            ):
                started = time.perf_counter()
                done = await verify_sample(verify, entry, shown, [], env)
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
            await prepare_task(env, TASK, FOLDERS, 60.0)
            times["task files+setup"].append(time.perf_counter() - started)
            if hasattr(env, "enter_clean_room"):  # as verification does: the tests are the verifier's alone
                await env.enter_clean_room()
            started = time.perf_counter()
            await reveal_tests(env, TASK, FOLDERS)
            times["task tests"].append(time.perf_counter() - started)
            assert (await env.exec(TASK["verify"])).exit_code == 0
        finally:
            await env.close()
    return times


# A workspace holding a repository of 2,000 committed files, one of them changed, verified by git: what the
# clean room's git neutraliser costs (its config, attributes and index marks for each repository).
REPOSITORY = (
    "git init -q . && for d in $(seq 40); do mkdir d$d && for f in $(seq 50); do echo $d $f > d$d/f$f; done; done"
    " && git add -A && git -c user.email=a@b -c user.name=a commit -qm base && echo changed > d1/f1"
)
GIT_VERIFY = {"prompt": "p", "verify": "! git diff --no-ext-diff --no-textconv --exit-code HEAD -- d1 > /dev/null"}


async def measure_git(kind: str, repeats: int) -> dict[str, list[float]]:
    settings = EnvironmentSettings(kind=kind, default_image="batch-runner-test/alpha:1", run_dir=tempfile.mkdtemp())
    env = await backend_for(settings).open({})
    times: dict[str, list[float]] = {"verify, git repo": []}
    try:
        assert (await env.exec(REPOSITORY, 120.0)).exit_code == 0
        record = {"prompt_index": 0, "metadata": {"source": GIT_VERIFY}}
        shown = (lambda: record) if "view" in inspect.signature(verify_sample).parameters else record
        for _ in range(repeats):
            started = time.perf_counter()
            done = await verify_sample(VerifySettings(), GIT_VERIFY, shown, [], env)
            times["verify, git repo"].append(time.perf_counter() - started)
            assert done["passed"], done
    finally:
        await env.close()
    return times


def kinds(docker: bool) -> tuple[str, ...]:
    return ("local", "bwrap", *(("docker",) if docker else ()))


def medians(args) -> dict[str, dict[str, list[float]]]:
    path = Path(tempfile.mkdtemp()) / "bench_verifier.py"
    path.write_text(VERIFIER)
    verifier = verifier_spec(f"{path}:check", "verifier")
    return {
        kind: asyncio.run(measure(kind, args.repeats, verifier))
        | (asyncio.run(measure_task(kind, args.repeats)) if prepare_task else {})
        | (asyncio.run(measure_git(kind, args.repeats)) if kind != "docker" else {})  # no git in the test images
        for kind in kinds(args.docker)
    }


def in_tree(tree: str, args) -> dict:
    """The raw times of the tree in `tree`, measured by this script in a process of its own there."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--json", f"--repeats={args.repeats}"]
    argv += ["--docker"] if args.docker else []
    env = {**os.environ, "PYTHONPATH": tree}
    return json.loads(subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True).stdout)


def compare(args) -> None:
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    here = str(Path(__file__).resolve().parent.parent)
    for _ in range(2):  # alternating, so a busy moment of the machine weighs on both
        runs["before"].append(in_tree(args.before, args))
        runs["after"].append(in_tree(here, args))
    print(f"{'':7} {'':16} {'before':>10} {'after':>10} {'ratio':>7}")
    for kind in kinds(args.docker):
        for label in (label for label in runs["after"][0][kind] if label in runs["before"][0][kind]):
            before, after = (
                statistics.median([1000 * v for run in runs[side] for v in run[kind][label]]) for side in runs
            )
            print(f"{kind:7} {label:16} {before:7.1f} ms {after:7.1f} ms {after / before:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--docker", action="store_true")
    parser.add_argument("--before", help="a tree of the code to compare with (git archive main | tar -x -C DIR)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:  # the built-in backends, registered as a run registers them (a --before tree has a fixed table)
        from trajforge import plugins

        plugins.load()
    except ImportError:
        pass
    if args.before:
        compare(args)
        return
    times = medians(args)
    if args.json:
        print(json.dumps(times))
        return
    for kind, measured in times.items():
        plain = statistics.median(measured["plain command"])
        for label, values in measured.items():
            ms = [1000 * v for v in values]
            ratio = statistics.median(values) / plain
            print(
                f"{kind:7} {label:16} median {statistics.median(ms):7.1f} ms   max {max(ms):7.1f} ms"
                f"   {ratio:5.1f}x a plain command"
            )


if __name__ == "__main__":
    main()
