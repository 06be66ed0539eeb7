"""The examples of README.md and docs/*.md: what a fenced block is and how one document's blocks run.

The convention, for whoever writes documentation (tests/test_docs_examples.py enforces it):

    ```bash                       a shell example: run, in document order, in one example folder
    ```bash not-run: REASON       a shell example that cannot run offline (a real key, a GPU server, a build)
    ```python file=PATH           a file the document's shell examples use (a verifier), written there first
    ```jsonl file=PATH            the same for data (a dataset)
    ```python not-run: REASON     Python that is not a file of an example

Any other block (```json, ```text, a bare ```) shows a shape and is not an example; nor is an inline
command with `...` in prose (a fragment). A shell example runs
with bash -e in a folder holding the checkout's batch_runner.py and data/*.jsonl, with `python` the test's
interpreter, inside a network namespace of its own with only loopback: every local endpoint an example
names (http://127.0.0.1:PORT/v1) is the scripted model on that port (an example starts its other servers,
an MCP server's http://127.0.0.1:PORT/mcp, itself), and a URL outside can never be
reached. What the examples cannot do there is taken out, and only that: the venv line and `pip install`
(the test's interpreter has the package already).

Run inside `unshare -rn` by the test: python docs_examples.py PLAN.json
    PLAN = {"ports": [...], "blocks": [{"where": ..., "script": ...}], "cwd": ..., "env": {...}, "result": ...}
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import PIPE, STDOUT

FENCE = re.compile(r"^```(\w*)[ \t]*(.*?)\n(.*?)^```[ \t]*$", re.M | re.S)
SHELL = {"bash", "sh", "shell"}
LOCAL_URL = re.compile(r"http://(?:127\.0\.0\.1|localhost):(\d+)/v1\b")  # an endpoint; not an MCP server's /mcp
# Set-up a test's interpreter has done already: the venv line, and `pip install ...` alone or before `&&`.
SET_UP = [(re.compile(r"^python3 -m venv .*$", re.M), "true"), (re.compile(r"\bpip install [^&\n]*(?:&&\s*|$)"), "")]


@dataclass
class Block:
    where: str  # "README.md:23", the line of its opening fence
    language: str
    text: str
    marks: dict[str, str] = field(default_factory=dict)  # not-run, file, exit

    @property
    def shell(self) -> bool:
        return self.language in SHELL

    @property
    def runs(self) -> bool:
        return self.shell and "not-run" not in self.marks

    def script(self) -> str:
        text = self.text
        for pattern, replacement in SET_UP:
            text = pattern.sub(replacement, text)
        return text


def _marks(info: str) -> dict[str, str]:
    """`not-run: reason`, `file=PATH`, `exit=N` from a fence's info string after the language."""
    if info.startswith("not-run"):
        return {"not-run": info.removeprefix("not-run").lstrip(":").strip()}
    return dict(word.partition("=")[::2] for word in info.split())


def blocks(path: Path, root: Path) -> list[Block]:
    text = path.read_text()
    name = str(path.relative_to(root))
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(f"{name}:{line}", match.group(1), match.group(3), _marks(match.group(2).strip())))
    return found


def ports(examples: list[Block]) -> list[int]:
    return sorted({int(port) for block in examples if block.runs for port in LOCAL_URL.findall(block.text)})


def main(plan_path: str) -> None:
    from trajforge.mock.server import MockServer

    plan = json.loads(Path(plan_path).read_text())
    servers = [MockServer() for _ in plan["ports"]]
    for server, port in zip(servers, plan["ports"], strict=True):
        server.start(port=port)
    results = []
    try:
        for block in plan["blocks"]:
            command = ["bash", "-e", "-o", "pipefail", "-c", block["script"]]
            started = time.monotonic()
            proc = subprocess.run(command, cwd=plan["cwd"], env=plan["env"], stdout=PIPE, stderr=STDOUT, text=True)
            seconds = round(time.monotonic() - started, 1)
            results.append({"where": block["where"], "code": proc.returncode, "out": proc.stdout, "seconds": seconds})
            if proc.returncode != block["exit"]:
                break  # later examples build on this one
    finally:
        for server in servers:
            server.stop()
    Path(plan["result"]).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
