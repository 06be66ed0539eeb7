"""Hidden test. The repository's code runs in a child process, as the agent's uid ($AS_AGENT), and only
this process's assert decides: an exit(0) or SystemExit in the code under test ends the child, not the
check, and the child can neither read this folder ($TESTS_DIR) nor reach this process."""

import json
import os
import shlex
import subprocess
import sys

CASES, EXPECTED = [[3, 1, 2], [4, 1, 3, 2], [5]], [2, 2.5, 5]
CALL = "from textkit.stats import median; print(json.dumps([median(v) for v in cases]))"
code = f"import json, os, sys; sys.path.insert(0, os.getcwd()); cases = json.loads(sys.argv[1]); {CALL}"
agent = shlex.split(os.environ.get("AS_AGENT", ""))  # empty where the backend has one uid
child = subprocess.run(
    [*agent, sys.executable, "-c", code, json.dumps(CASES)], capture_output=True, text=True, timeout=60
)
assert child.stdout.splitlines()[-1:] == [json.dumps(EXPECTED)], child.stdout + child.stderr
print("median: all tests passed")
