"""What the clean room's git checks cost on a repository of realistic size (review 2):

    python bench/git_objects.py --megabytes 100 --files 5000 --repeats 3
    python bench/git_objects.py --from PATH/TO/A/CLONE/OF/python/mypy --repeats 3

A repository of `--files` files holding `--megabytes` of incompressible data over a few commits is made
and packed (`git gc`, as a clone brings it), or `--from` a repository is cloned (its history's deltas:
what index-pack resolves). When the agent begins, the record of the packs (shell.PACKS_SCRIPT, as
agent_begins makes it) is timed. Then the agent's work: ten files added and committed (loose objects), and
a tracked file touched and added again, whose blob git writes again: git freshens the pack that holds it
(its mtime, so its ctime, is new). The clean room's scan (shell.ESCAPES_SCRIPT with GIT_NEUTRAL, run as
remove_escapes runs it) is timed with SINCE at the agent's start (local, bwrap: only the agent's object
files are checked) and with SINCE=0 (docker, whose carried files are all new: every object file is
checked), each with the record (a freshened pack is hashed, not verified) and without it (as before the
record: every new pack verified whole, verify-pack), beside
`git fsck --no-dangling` and, for scale, the verify command's `git diff --exit-code COMMIT` and `git
status` before and after the scan (after it, the index holds no stat data: git reads every file once).
Medians of `--repeats` runs, in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trajforge.environments.shell import ESCAPES_SCRIPT, GIT_ENV, GIT_NEUTRAL, PACKS_SCRIPT

GIT = {**os.environ, **GIT_ENV, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b"}
GIT |= {"GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, env=GIT, check=True, stdout=subprocess.DEVNULL)


def make_repo(root: Path, megabytes: int, files: int, source: str | None) -> str:
    if source:
        git(root, "clone", "-q", "--no-local", source, ".")
        return head(root)
    git(root, "init", "-q", ".")
    size = megabytes * 2**20 // files
    for commit in range(4):  # four commits, each rewriting a quarter of the files
        for n in range(commit * files // 4, (commit + 1) * files // 4):
            path = root / f"d{n % 50}" / f"f{n}.bin"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(os.urandom(size))
        git(root, "add", "-A")
        git(root, "commit", "-qm", f"c{commit}")
    git(root, "gc", "-q")
    return head(root)


def head(root: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, env=GIT, capture_output=True, text=True).stdout


def tracked_files(root: Path) -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=root, env=GIT, capture_output=True, text=True).stdout.split()


def timed(argv: list[str], cwd: Path, env: dict, given: str = "") -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, input=given, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{argv[:3]} exited {done.returncode}: {done.stdout[-500:]}{done.stderr[-500:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--from", dest="source", help="clone this repository instead of making one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        commit = make_repo(root, args.megabytes, args.files, args.source).strip()
        since = int(time.time()) + 1
        time.sleep(2)  # the agent's files: a later second than every file of the task's
        begins = time.perf_counter()
        packs = subprocess.run(["sh", "-c", PACKS_SCRIPT, "sh", str(root)], env=GIT, capture_output=True, text=True)
        print(f"{'the record of the packs (agent_begins)':48s} once   {time.perf_counter() - begins:7.2f} s")
        for n in range(10):
            (root / f"agent{n}.bin").write_bytes(os.urandom(1000))
        first = tracked_files(root)[0]
        os.utime(root / first)  # its blob is written again by add: the pack holding it is freshened
        git(root, "add", "-A")
        git(root, "commit", "-qm", "agent")
        packed = sum(f.stat().st_size for f in (root / ".git/objects/pack").iterdir()) / 2**20
        print(f"repository: {len(tracked_files(root))} files, {packed:.0f} MB packed, 10 files added by the agent")
        scan = ["sh", "-c", ESCAPES_SCRIPT, "sh", str(root)]
        base = {**GIT, "HOME": "/", "MARK": "removed:", "GIT_NEUTRAL": GIT_NEUTRAL}
        record = packs.stdout
        figures = {
            "scan, SINCE at the agent's start, the record": (scan, {**base, "SINCE": str(since)}, record),
            "scan, SINCE at the agent's start, no record": (scan, {**base, "SINCE": str(since)}, ""),
            "scan, SINCE=0 (every object file), the record": (scan, {**base, "SINCE": "0"}, record),
            "scan, SINCE=0 (every object file), no record": (scan, {**base, "SINCE": "0"}, ""),
            "git fsck --no-dangling": (["git", "fsck", "--no-dangling", "--no-progress"], GIT, ""),
            "git diff --exit-code COMMIT": (["git", "diff", "--quiet", "--exit-code", commit], GIT, ""),
            "git status --porcelain": (["git", "status", "--porcelain"], GIT, ""),
        }
        for name, (argv, env, given) in figures.items():
            runs = [timed(argv, root, env, given) for _ in range(args.repeats)]
            print(f"{name:48s} median {statistics.median(runs):7.2f} s  (max {max(runs):.2f})")
        git(root, "update-index", "--no-split-index")  # the index as the scan leaves it: no stat data
        subprocess.run("git ls-files -s -z | git update-index -z --index-info", shell=True, cwd=root, env=GIT)
        for name in ("git diff --exit-code COMMIT", "git status --porcelain"):
            argv, env, _ = figures[name]
            print(f"{name + ', index without stat data':48s} first run {timed(argv, root, env):7.2f} s")


if __name__ == "__main__":
    main()
