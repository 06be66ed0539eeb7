"""Run batch_runner.py commands against the scripted server where nothing else can be reached.

tests/test_run_settings.py starts this inside a network namespace of its own (`unshare -rn`), with only
a loopback device: a --resume that lost the run's --base_url would send its requests to the public
default endpoint, and here it finds no route instead. The server runs in this process, so every
command of the plan talks to the same one (its per-prompt failure counts carry over).

    python offline.py PLAN.json    # {"commands": [{"args": [...], "env": {...}}, ...], "run_dir": ..., "result": ...}

"{base_url}" in an argument is replaced by the server's URL. The result file gets, per command, its
exit status, output and the run folder's statistics.json after it; and the server's request log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trajforge.mock.server import MockServer


def main(plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    server = MockServer()
    base_url = server.start()
    statistics = Path(plan["run_dir"]) / "statistics.json"
    results = []
    try:
        for command in plan["commands"]:
            env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")} | command.get("env", {})
            args = [arg.replace("{base_url}", base_url) for arg in command["args"]]
            proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300)
            stats = json.loads(statistics.read_text()) if statistics.exists() else None
            results.append({"code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "statistics": stats})
    finally:
        server.stop()
    Path(plan["result"]).write_text(json.dumps({"results": results, "requests": server.requests}))


if __name__ == "__main__":
    main(sys.argv[1])
