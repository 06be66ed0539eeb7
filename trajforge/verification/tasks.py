"""Tasks as data: an entry's `files`/`workspace` (put in place before the agent starts), its `setup`
(run before the first model call), its hidden `tests` (written only right before verification) and its
`solution` (the oracle, for --check_tasks).

`workspace` and a directory-valued `tests` are host folders, relative to the dataset file, that must lie inside
its folder or a --task_root folder, symlinks followed (host_folders.py: where they may lie, how they are read).
Every path of a `files` or `tests` mapping lands inside the sample's working directory (files) or a fresh tests
directory: none may be absolute or climb out with `..`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import posixpath

from trajforge.environments import Environment
from trajforge.environments.folder_task import KEY as FOLDER_TASK
from trajforge.errors import SetupFailed
from trajforge.verification.host_folders import HostFolders

TASK_FIELDS = ("files", "workspace", "setup", "tests", "solution")
AGENT_LOGS = "/logs/agent"  # a task folder's (Harbor): where an agent may keep its logs
SETUP_OUTPUT_CAP = 4000  # characters of a failed setup's output kept in the error


MAX_NAME_BYTES, MAX_PATH_BYTES, MAX_PATH_LEVELS = 255, 4096, 256


def path_problem(path: str) -> str | None:
    """Why the system cannot take `path` (a cwd, an image name, a file to put in place), or None."""
    if any(ord(char) < 32 or ord(char) == 127 for char in path):
        return "holds a NUL or control character"
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > MAX_PATH_BYTES:
        return f"is {size} bytes long, more than {MAX_PATH_BYTES}"
    parts = path.split("/")
    if len(parts) > MAX_PATH_LEVELS:
        return f"has {len(parts)} levels, more than {MAX_PATH_LEVELS}"
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in parts)
    if longest > MAX_NAME_BYTES:
        return f"has a name of {longest} bytes, more than {MAX_NAME_BYTES}"
    return None


def _path_problem(field: str, path) -> str | None:
    if not isinstance(path, str) or not path:
        return f'"{field}" has a path that is not a non-empty string: {path!r}'
    if problem := path_problem(path):
        return f'"{field}" path {path!r} {problem}'
    normal = posixpath.normpath(path)
    if posixpath.isabs(path) or normal == ".." or normal.startswith("../") or normal == ".":
        return f'"{field}" path {path!r} leaves the workspace'
    return None


def _mapping_problem(field: str, value) -> str | None:
    for path, content in value.items():
        if problem := _path_problem(field, path):
            return problem
        if isinstance(content, dict):
            if set(content) != {"base64"} or not isinstance(content["base64"], str):
                return f'"{field}" {path!r}: an object value must be {{"base64": "..."}}'
            try:
                base64.b64decode(content["base64"], validate=True)
            except binascii.Error:
                return f'"{field}" {path!r}: not valid base64'
        elif not isinstance(content, str):
            return f'"{field}" {path!r} must be text or {{"base64": "..."}}, got {type(content).__name__}'
    return None


def task_problem(data: dict, folders: HostFolders) -> str | None:
    """Why an entry's task fields cannot be used, or None. `folders`: where its host folders may lie."""
    for field in ("setup", "solution"):
        if field in data and not (isinstance(data[field], str) and data[field].strip()):
            return f'"{field}" must be a non-empty shell command'
    if "workspace" in data and (problem := folders.problem("workspace", data["workspace"])):
        return problem
    if (
        "workspace" in data
        and isinstance(data.get("cwd"), str)
        and (problem := folders.cwd_problem(data["workspace"], data["cwd"]))
    ):
        return problem
    for field in ("files", "tests"):
        value = data.get(field)
        if value is None and field not in data:
            continue
        if field == "tests" and isinstance(value, str):
            problem = folders.problem(field, value)
        elif isinstance(value, dict):
            problem = _mapping_problem(field, value)
        else:
            problem = f'"{field}" must be an object of path -> text' + (" or a directory" if field == "tests" else "")
        if problem:
            return problem
    return None


def _decoded(mapping: dict) -> dict[str, bytes]:
    return {
        path: base64.b64decode(content["base64"]) if isinstance(content, dict) else content.encode()
        for path, content in mapping.items()
    }


def workspace_files(entry: dict, folders: HostFolders) -> dict[str, bytes]:
    """What goes into the sample's working directory first: the `workspace` folder, then `files` over it."""
    found = folders.read(entry["workspace"]) if "workspace" in entry else {}
    return found | _decoded(entry.get("files") or {})


def test_files(entry: dict, folders: HostFolders) -> dict[str, bytes]:
    """The entry's hidden tests, by relative path (empty when it has none)."""
    tests = entry.get("tests")
    if isinstance(tests, str):
        return folders.read(tests)
    return _decoded(tests or {})


async def prepare_task(env: Environment, entry: dict, folders: HostFolders, timeout: float) -> None:
    """Before the first model call: the files in place, then the setup run in the sample's environment
    (the agent's sandbox and limits, its working directory). SetupFailed when the setup does not succeed."""
    try:
        files = await asyncio.to_thread(workspace_files, entry, folders)  # maybe a helper process's reading
    except OSError as exc:  # Unreadable: outside the roots by now, or not readable with the owner's rights
        raise SetupFailed(f"the task's workspace could not be read: {exc}") from None
    try:
        await env.write_files(files)
    except OSError as exc:  # e.g. "a" a file and "a/b" one too, or the workspace folder changed since the load
        raise SetupFailed(f"the task's files could not be written: {exc}") from None
    if FOLDER_TASK in entry:
        # Its tests/ are read where the sample runs, at verification: a Ray node without the task folder
        # fails the sample now, before a model call, rather than record a verification that could not run.
        folder = entry[FOLDER_TASK]["folder"]
        if not os.path.isfile(os.path.join(folder, "tests", "test.sh")):
            raise SetupFailed(
                f"the task folder {folder} is not on this machine (no tests/test.sh there): every Ray node "
                "needs the task folders at the path the driver read them from (docs/tasks.md)"
            )
        await env.exec(f"mkdir -p {AGENT_LOGS}", timeout)  # Harbor's place for the agent's logs, as in its runs
    setup = entry.get("setup")
    if not setup:
        return
    done = await env.exec(setup, timeout, capped=False)
    if done.timed_out or done.exit_code:
        why = done.error or f"exit status {done.exit_code}"
        output = done.output[-SETUP_OUTPUT_CAP:]
        raise SetupFailed(f"setup {setup!r} failed ({why}); its output:\n{output}")


async def reveal_tests(env: Environment, entry: dict, folders: HostFolders) -> None:
    """Right before the verify command: end whatever the agent left running, write the hidden tests into
    a fresh directory and point $TESTS_DIR (and a Python verifier's env.tests_dir) at it."""
    tests = await asyncio.to_thread(test_files, entry, folders)
    if tests or "tests" in entry:
        await env.add_tests(tests)
