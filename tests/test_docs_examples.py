"""Every example of README.md and docs/*.md runs, offline, against the scripted model, as a reader would
paste it (the convention and how a document's blocks run: tests/docs_examples.py). An example that cannot
run offline says why; every other one must run, exit as it says, and leave run folders without a failed
prompt or a verifier error. And docs/internals.md's Layout names every module of the package, and
every relative link of these documents names a file that exists."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from docs_examples import Block, blocks, ports

from trajforge import builtin, journal
from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.verification.checks import verify_sample
from trajforge.verification.result import VerifySettings

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = {path.name: blocks(path, ROOT) for path in DOCUMENTS}


def test_every_example_runs_or_says_why_not():
    problems = []
    for examples in EXAMPLES.values():
        scripts = "\n".join(block.text for block in examples if block.runs)
        for block in examples:
            if "not-run" in block.marks and not block.marks["not-run"]:
                problems.append(f"{block.where}: not-run without a reason")
            elif "file" in block.marks and block.marks["file"] not in scripts:
                problems.append(f"{block.where}: file={block.marks['file']} is used by no example of its document")
            elif block.language == "python" and not block.marks:
                problems.append(f"{block.where}: a python block is a file= of an example or not-run: why")
    assert not problems, "\n".join(problems)
    assert any(block.runs for examples in EXAMPLES.values() for block in examples)


def test_the_layout_names_every_module_and_only_those():
    layout = (ROOT / "docs" / "internals.md").read_text()
    listed = set(re.findall(r"^  ([\w/]+\.py) ", layout, re.M))
    package = ROOT / "trajforge"
    modules = {path.relative_to(package).as_posix() for path in package.rglob("*.py")}
    assert sorted(m for m in modules - listed if not m.endswith("__init__.py")) == []
    assert sorted(listed - modules) == []


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a markdown link's target, its anchor left off


def test_every_relative_link_names_a_file_that_exists():
    broken = []
    for path in DOCUMENTS:
        for target in LINK.findall(path.read_text()):
            if "://" not in target and not target.startswith("mailto:") and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


def example_folder(tmp_path: Path, examples: list[Block]) -> Path:
    """What a reader has: the checkout's entry point and datasets, and the document's own files."""
    folder = tmp_path / "example"
    (folder / "data").mkdir(parents=True)
    (folder / "batch_runner.py").symlink_to(ROOT / "batch_runner.py")  # imports the checkout's package
    for dataset in (ROOT / "data").glob("*.jsonl"):
        shutil.copy(dataset, folder / "data")
    for tasks in (ROOT / "data").glob("*/"):  # the folders the example tasks take their files from
        if not (tasks / "run.json").exists() and not (tasks / "checkpoint.json").exists():  # a reader's own runs
            shutil.copytree(tasks, folder / "data" / tasks.name)
    for block in examples:
        if "file" in block.marks:
            target = folder / block.marks["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
    return folder


def run_examples(tmp_path: Path, examples: list[Block]) -> list[dict]:
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode:
        pytest.skip("no network namespaces here (unshare -rn): an example without --base_url is not safe to run")
    folder = example_folder(tmp_path, examples)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        # A script that execs the interpreter by its path, not a link to it: a venv's interpreter reached
        # through a link elsewhere finds no pyvenv.cfg beside it and loses the venv's packages.
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        wrapper.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env |= {"LANG": "C.UTF-8", "COLUMNS": "120"}
    runnable = [
        {"where": b.where, "script": b.script(), "exit": int(b.marks.get("exit", 0))} for b in examples if b.runs
    ]
    plan = {"ports": ports(examples), "blocks": runnable, "cwd": str(folder), "env": env}
    plan["result"] = str(tmp_path / "result.json")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    driver = f'ip link set lo up && exec "{sys.executable}" "{ROOT / "tests" / "docs_examples.py"}" "{plan_path}"'
    driver_env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        ["unshare", "-rn", "sh", "-c", driver], capture_output=True, text=True, timeout=900, env=driver_env
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(Path(plan["result"]).read_text())
    for block, result in zip(runnable, results, strict=False):
        assert result["code"] == block["exit"], f"{result['where']} exited {result['code']}:\n{result['out'][-3000:]}"
    assert len(results) == len(runnable)
    return results


def unclean(folder: Path) -> list[str]:
    """What went wrong in the examples' run folders: failed prompts, verifier errors."""
    found = []
    for run_dir in sorted(p for p in (folder / "data").iterdir() if (p / "checkpoint.json").exists()):
        failed = json.loads((run_dir / "checkpoint.json").read_text())["failed_prompts"]
        if failed:
            found.append(f"{run_dir.name}: failed prompts {failed}: {(run_dir / 'errors.jsonl').read_text()[-500:]}")
        for batch in sorted(run_dir.glob("batch_*.jsonl")):
            for line in filter(str.strip, batch.read_text().splitlines()):  # as the merge reads them
                verification = journal.verification_of(json.loads(line)) or {}
                if verification.get("error"):
                    found.append(f"{run_dir.name}/{batch.name}: {verification['error']}")
    return found


@pytest.mark.timeout(900)
@pytest.mark.parametrize("document", [name for name, examples in EXAMPLES.items() if any(b.runs for b in examples)])
def test_the_examples_of_a_document_run(tmp_path, document):
    examples = EXAMPLES[document]
    run_examples(tmp_path, examples)
    problems = unclean(tmp_path / "example")
    assert not problems, "\n".join(problems[:10])


# A correct solution of every task a document's example verifies, by the file it asks for: the example's
# verify command must pass after it and fail in an empty workspace (issue 31: the is_prime example of
# docs/verification.md could never pass).
SOLUTIONS = {
    "fib.py": "printf 'a, b = 0, 1\\nfor _ in range(10):\\n    a, b = b, a + b\\nprint(a)\\n' > fib.py",
    "is_prime.py": (
        "printf 'def is_prime(n):\\n    return n > 1 and all(n %% d for d in range(2, int(n ** 0.5) + 1))\\n'"
        " > is_prime.py"
    ),
    "report.md": "printf '# Report\\n\\n- one\\n- two\\n- three\\n' > report.md",
    "answer.txt": "echo 42 > answer.txt",
}


def verified_examples() -> list[tuple[str, dict]]:
    """Every dataset line with a `verify` in a block of README.md or docs/*.md, with where it is."""
    found = []
    for examples in EXAMPLES.values():
        for block in examples:
            for line in block.text.splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict) and "verify" in entry and not _plugin_s(entry["verify"]):
                        found.append((block.where, entry))
    return found


def _plugin_s(verify) -> bool:
    """A check only a plugin registers (docs/plugins.md): its document's own example runs it, with the plugin."""
    return isinstance(verify, dict) and not set(verify) <= set(builtin.VERIFIERS)


def test_every_documented_verify_passes_a_solution_and_fails_without_one(tmp_path):
    kind = "bwrap" if shutil.which("bwrap") else "local"
    settings = EnvironmentSettings(kind=kind, run_dir=str(tmp_path), command_timeout=30)

    async def verdict(entry: dict, solution: str) -> dict:
        env = await backend_for(settings).open(entry)
        try:
            await env.exec(solution)
            return await verify_sample(VerifySettings(), entry, {}, [], env)
        finally:
            await env.close()

    examples = verified_examples()
    assert len(examples) >= 4, examples
    for where, entry in examples:
        named = [name for name in SOLUTIONS if name in entry["prompt"]]
        assert named, f"{where}: no solution of {entry['prompt']!r} in SOLUTIONS: add one"
        solved, unsolved = asyncio.run(verdict(entry, SOLUTIONS[named[0]])), asyncio.run(verdict(entry, "true"))
        assert (solved["passed"], unsolved["passed"]) == (True, False), (where, solved, unsolved)
