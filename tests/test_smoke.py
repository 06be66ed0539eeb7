"""The README's commands as a user types them, each in a process of its own: the demo on the example
dataset with the scripted model, and --list_distributions."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT

from trajforge.tools.browser.runtime import launch_problem
from trajforge.tools.settings import find_browser


def test_the_demo_command_on_the_example_dataset(tmp_path):
    readme = "batch_runner.py --dataset_file=data/example_prompts.jsonl --batch_size=4 --run_name=demo --model=mock"
    proc = subprocess.run(
        [sys.executable, *readme.split(), f"--output_dir={tmp_path}"],  # the run folder outside the checkout
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    # No stray warnings (unclosed sessions, child watchers) on a clean run: stderr holds the progress line and
    # the runner's own warnings (a tool not offered here) alone.
    progress = re.compile(r"\[\d\d:\d\d:\d\d\] \d+/\d+ prompts ended, |warning: \w+ is not available here")
    assert proc.stderr and all(progress.match(line) for line in proc.stderr.splitlines()), proc.stderr
    assert len((tmp_path / "demo" / "trajectories.jsonl").read_text().splitlines()) == 8
    assert "Verification: 2/3 samples passed" in proc.stdout  # the entries with `verify` show a pass rate


def test_list_distributions_command():
    env = {k: v for k, v in os.environ.items() if k != "BROWSER_EXECUTABLE"}
    env |= {"WEB_SEARCH_URL": "http://127.0.0.1:9", "COLUMNS": "200"}  # a provider, never asked
    proc = subprocess.run(
        [sys.executable, str(ROOT / "batch_runner.py"), "--list_distributions"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("default", "terminal_tasks", "mixed_tasks", "browser_only", "code_execution"):
        assert f"│ {name} " in proc.stdout
    problem = launch_problem(find_browser(os.environ))
    if problem is None:  # what is left out and why: tests/test_toolsets_e2e.py
        assert "Every toolset is available on this machine." in proc.stdout
        assert "(partly)" not in proc.stdout and "(unavailable)" not in proc.stdout
    else:
        assert "browser 100% (unavailable)" in proc.stdout, problem
