"""Shared fixtures: a real OpenAI-compatible server (the scripted model) on 127.0.0.1, and helpers that
run the real batch_runner.py against it, as a subprocess (`run`) or through its entry point in this
process (`run_here`)."""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from leftovers import remove_leftovers, summary

from trajectory import record_usage, tool_stats
from trajforge import journal, plugins
from trajforge.environments import loops
from trajforge.errors import UsageError
from trajforge.journal.sample import OWN_KEYS, Sample, now
from trajforge.mock.server import MockServer
from trajforge.model.usage import empty_usage
from trajforge.runfolder.folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]

plugins.load()  # the built-ins, registered as a run registers them, for tests that use tools or exports directly

API_KEY = "sk-test-SECRET-0123456789"


# Started first, the heaviest first, so that under xdist the longest tests do not end the run on one worker
# while the rest idle (the small tests of every other file fill in at the end). By their time in a whole
# run: Ray's group (test_ray.py, on one worker), the documents' examples
# (38 s for README.md's), the MCP servers' runs, the wheel's install (22 s), the rest of the heavy ones.
SLOW_FIRST = (
    "test_ray.py",
    "test_docs_examples.py",
    "test_mcp.py",
    "test_hostile_replies.py",
    "test_install.py",
    "test_containment.py",
    "test_docker.py",
    "test_browser.py",
    "test_task_folders.py",
    "test_unprivileged.py",
)


def pytest_configure(config) -> None:
    """The byte code of our modules, written once: about 50 tests start batch_runner.py as a process, and
    where PYTHONDONTWRITEBYTECODE is set (as on CI) each would compile them all again (0.2 s of CPU)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        compileall.compile_dir(ROOT / "trajforge", quiet=1)
        for module in ("batch_runner.py", "toolset_distributions.py", "trajectory.py"):
            compileall.compile_file(ROOT / module, quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: each file's order stays


@pytest.hookimpl(tryfirst=True)  # before its fixtures are made
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test of an xdist_group whose group this pytest ignores fails: the groups share what is made once (one Ray
    cluster a session), and scattered over the workers each would make its own."""
    if item.config.getoption("loadgroup", False) and item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
        pytest.fail(
            "this pytest ignores xdist_group (pytest-xdist#1386): pip install -e '.[test,ray]' has one that keeps it",
            pytrace=False,
        )


def scripted_server():
    mock = MockServer()
    mock.base_url = mock.start()
    yield mock
    mock.stop()


server = pytest.fixture(scripted_server, name="server")
judge = pytest.fixture(scripted_server, name="judge")  # a second one: the judge's endpoint (--judge_base_url)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    run_dir: Path

    def jsonl(self, name: str) -> list[dict]:
        path = self.run_dir / name
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    @property
    def trajectories(self) -> list[dict]:
        return self.jsonl("trajectories.jsonl")

    @property
    def batch_lines(self) -> list[dict]:
        """Every batch-file line (a journalled sample) as its trajectory record, with the keys the batch
        file holds beside it (discarded, redactions, tokens, nonzero_exits) when it has them."""
        return [as_record(r) for p in sorted(self.run_dir.glob("batch_*.jsonl")) for r in self.jsonl(p.name)]

    @property
    def statistics(self) -> dict:
        return json.loads((self.run_dir / "statistics.json").read_text())

    @property
    def checkpoint(self) -> dict:
        return json.loads((self.run_dir / "checkpoint.json").read_text())


def as_record(line: dict) -> dict:
    """A batch line of any version as its record, the batch file's own keys beside it."""
    sample = journal.read(line, b"")
    own = {key: getattr(sample, key) for key in OWN_KEYS if getattr(sample, key)}
    return sample.record() | own


def sample_of(
    *,
    entry: dict,
    turns: list,
    tool_schemas: list[dict] = (),
    tool_names: list[str] = (),
    prompt_index: int = 0,
    exit_reason: str = "completed",
    usage: dict | None = None,
    verification: dict | None = None,
    **fields,
) -> Sample:
    """A finished sample as the worker journals it: `tool_schemas` as OpenAI tool objects, `tool_names`
    the keys of tool_stats, `verification` {} (not yet verified) unless given; `fields` any other
    Sample field (model, run_name, duration_seconds, batch_num, ...)."""
    defaults = {"sample_index": 0, "batch_num": 0, "toolsets": ["terminal"], "api_calls": len(turns), "model": "m"}
    defaults |= {"model_reported": "", "run_name": "r", "duration_seconds": 1.5, "token_drift": "[]"}
    return Sample(
        prompt_index=prompt_index,
        entry=entry,
        tools=[schema["function"] for schema in tool_schemas],
        turns=turns,
        exit_reason=exit_reason,
        usage=record_usage(usage if usage is not None else empty_usage()),
        verification=verification or {},
        tool_stats=tool_stats(turns, list(tool_names))[0],
        timestamp=now(),
        **(defaults | fields),
    )


def source(record: dict) -> dict:
    """The dataset entry of a trajectory record (kept as JSON text in `metadata.source`) or of a batch line."""
    return journal.entry_of(record)


def calls(turn: dict) -> list[dict]:
    """The structured tool calls of a turn (kept as JSON text in `tool_calls`)."""
    return json.loads(turn["tool_calls"])


def tool_results(trajectory: dict) -> str:
    """Every tool turn of a trajectory, joined."""
    return "\n".join(turn["value"] for turn in trajectory["conversations"] if turn["from"] == "tool")


def write_dataset(path: Path, entries: list) -> Path:
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in entries))
    return path


def wait_for(
    condition: Callable[[], object], timeout: float = 60, what: str | Callable[[], str] = "the condition"
) -> None:
    """Poll `condition` until it holds; fail naming `what` (or what it returns then) after `timeout` seconds.
    A cheap condition is polled every 10 ms; a costly one (a scan of every process's command line: 10-20 ms
    of CPU with a few hundred processes) waits four times its own cost between looks (half a second at
    most): a wait takes at most a fifth of a core from the rest of the suite, which has two."""
    deadline = time.monotonic() + timeout
    while True:
        started = time.monotonic()
        if condition():
            return
        now = time.monotonic()
        if now > deadline:
            pytest.fail(f"gave up waiting for {what() if callable(what) else what} after {timeout} s")
        time.sleep(min(max(0.01, 4 * (now - started)), 0.5))


def loop_sequence(device: str) -> str:
    """The sequence number the kernel gave the loop device at `device` as it was bound (each binding and letting go
    takes a new one), "" while it is bound to nothing."""
    sysfs = f"/sys/block/{os.path.basename(device)}"
    if not os.path.exists(f"{sysfs}/loop/backing_file"):
        return ""
    return Path(sysfs, "diskseq").read_text().strip()


def detach_as_bound(bound: dict[str, str]) -> None:
    """The loop devices of `bound` still bound as they were then detached, each held open from its check to its
    detaching: `losetup -d` after a check detached another test's device bound there meanwhile (detaching one of
    these had freed another, a disk whose file system a file of the first lay on, and its number was taken)."""
    for device, sequence in bound.items():
        with contextlib.suppress(OSError):
            held = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
            try:  # held open: it stays bound so until the detaching, at its closing
                if loop_sequence(device) == sequence:
                    fcntl.ioctl(held, loops.LOOP_CLR_FD)
            finally:
                os.close(held)


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of batch_runner's console entry point called in this process with
    `args` as its command line: Fire parses the same flags, and the workers fork from here."""
    import batch_runner  # only the tests that run it pay for its imports

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["batch_runner.py", *args]
    handlers = [signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            batch_runner.cli()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.argv = argv
    # A run that stopped early ignores further signals while it finishes up; after it, this process (and
    # every run later tests start from it) must hear them again.
    assert [signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)] == handlers
    return code, out.getvalue(), err.getvalue()


def released(run) -> bool:
    """The killed run's workers are gone too (they die a moment after it): its folder lock is free."""
    try:
        with RunFolder(run.tmp_path / "out" / "run").locked():
            pass
    except UsageError:
        return False
    return True


def settled(server) -> bool:
    """Every chat request a killed client sent is in the server's log: no connection of it is left open on the
    server's side (one still in the accept queue, or with a request unread, is counted later: under load, after
    the resume began), and every request it started on has its reply logged (after its latency)."""
    return not _open_on(server.port) and sum(server.attempts.values()) == len(server.chat_requests())


def _open_on(port: int) -> int:
    """Connections to a port of this host's loopback not yet closed by its server (ESTABLISHED, CLOSE_WAIT)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    fields = (line.split() for line in lines)
    return sum(int(local.rpartition(":")[2], 16) == port and state in ("01", "08") for _, local, _, state, *_ in fields)


class Runner:
    """Runs batch_runner.py in `tmp_path` against `server` with a dataset given as a list of entries,
    as a subprocess: for what only a process shows (signals, kill -9, its command line, its exit)."""

    def __init__(self, tmp_path: Path, server: MockServer | None):
        self.tmp_path = tmp_path
        self.server = server

    def command(self, entries, *flags: str, run_name: str = "run", batch_size: int = 2) -> list[str]:
        dataset = entries if isinstance(entries, Path) else write_dataset(self.tmp_path / "prompts.jsonl", entries)
        command = [
            sys.executable,
            str(ROOT / "batch_runner.py"),
            f"--dataset_file={dataset}",
            f"--batch_size={batch_size}",
            f"--run_name={run_name}",
            f"--output_dir={self.tmp_path / 'out'}",
        ]
        if self.server is not None:
            command += [f"--base_url={self.server.base_url}", "--model=test-model", f"--api_key={API_KEY}"]
        return [*command, *flags]

    def __call__(self, entries, *flags: str, run_name: str = "run", batch_size: int = 2, timeout: float = 120):
        return self.start(entries, *flags, run_name=run_name, batch_size=batch_size).result(timeout)

    def start(self, entries, *flags: str, run_name: str = "run", batch_size: int = 2) -> Started:
        """The same run, started in the background: for a test that does something else meanwhile."""
        env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")}
        proc = subprocess.Popen(
            self.command(entries, *flags, run_name=run_name, batch_size=batch_size),
            cwd=self.tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        return Started(proc, self.tmp_path / "out" / run_name)


class Started:
    """A run of batch_runner.py going on in the background (Runner.start)."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path):
        self.proc = proc
        self.run_dir = run_dir
        self.ended: Result | None = None

    def result(self, timeout: float = 120) -> Result:
        """Its Result, once it has ended; killed (and the test failed) if it runs past `timeout` seconds."""
        if self.ended is None:
            try:
                stdout, stderr = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
            self.ended = Result(self.proc.returncode, stdout, stderr, self.run_dir)
        return self.ended

    def kill(self) -> None:
        """Ends it if it still runs (a test that failed before it waited for it)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


class InProcessRunner(Runner):
    """The same runs through `run_cli` in this process: no 2 s of imports per run, and an exception in
    the driver fails the test with its own traceback. Needs the cwd in `tmp_path` and no API key in
    the environment, as the subprocess has (the `run_here` fixture sets both)."""

    def __call__(self, entries, *flags: str, run_name: str = "run", batch_size: int = 2, timeout: float = 120):
        # `timeout` is the subprocess's; here pytest-timeout bounds a run.
        command = self.command(entries, *flags, run_name=run_name, batch_size=batch_size)
        code, stdout, stderr = run_cli(command[2:])
        return Result(code, stdout, stderr, self.tmp_path / "out" / run_name)


@pytest.fixture
def run(tmp_path, server) -> Runner:
    return Runner(tmp_path, server)


def _here(patch: pytest.MonkeyPatch, tmp_path: Path, server: MockServer | None) -> InProcessRunner:
    """An InProcessRunner with what it needs set by `patch`: the cwd in `tmp_path`, no API key in the environment."""
    import trajforge.run.runner  # noqa: F401  (batch_runner.main's imports, paid once, before a test times anything)

    patch.chdir(tmp_path)
    for name in [k for k in os.environ if k.endswith("API_KEY")]:
        patch.delenv(name)
    return InProcessRunner(tmp_path, server)


@pytest.fixture
def run_here(tmp_path, server, monkeypatch) -> InProcessRunner:
    return _here(monkeypatch, tmp_path, server)


@contextlib.contextmanager
def running_here(tmp_path: Path, server: MockServer | None):
    """`run_here` for a module- or session-scoped fixture: one run (or a few) that many tests read. The cwd
    and the environment are restored when the block ends, before any test runs."""
    with pytest.MonkeyPatch.context() as patch:
        yield _here(patch, tmp_path, server)


# A scripted server for a module-scoped fixture's runs (what its tests read of the server is that one's).
module_server = pytest.fixture(scripted_server, name="module_server", scope="module")


@pytest.fixture(scope="session")
def site():
    """A web site on 127.0.0.1 for the web and browser tools (tests/local_site.py)."""
    from local_site import LocalSite

    with LocalSite() as local:
        yield local


PRIVATE_DOCKERD = Path("/tmp/ci-docker/docker.pid")  # written by the dockerd that .ci/docker-up starts
STARTED_BY = Path("/tmp/ci-docker/started-by-pytest")  # the pytest session that started it, which stops it
DOCKER_UP_LOCK = Path("/tmp/batch-runner-docker-up.lock")
# Held shared by every test process that uses the engine, for its life: the session that started the engine
# stops it only when it can take this lock alone (no other session's tests still use it).
DOCKER_USERS_LOCK = Path("/tmp/batch-runner-docker-users.lock")
_using_docker: list = []  # this process's shared hold of DOCKER_USERS_LOCK


@pytest.fixture(scope="session", autouse=True)
def no_leftovers(tmp_path_factory):
    """What a test's killed run left (its disks, mounts, cgroups: leftovers.py) goes at the session's end."""
    yield
    remove_leftovers(tmp_path_factory.getbasetemp())


def pytest_terminal_summary(terminalreporter, config) -> None:
    """What the session's killed runs left and no_leftovers removed, said (the xdist controller reads its
    workers' reports below its own temporary folder)."""
    for line in summary(config._tmp_path_factory.getbasetemp()):
        terminalreporter.write_line(line)


def _session_pid() -> int:
    """The pid of the whole test session: the xdist controller (each worker's parent), else this process."""
    return os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()


@pytest.fixture(scope="session")
def docker_host() -> str:
    """A Docker engine with the test images (batch-runner-test/alpha:1, batch-runner-test/beta:1).
    .ci/docker-up uses $DOCKER_HOST when it answers, else starts a private loopback-only dockerd, which
    the last test session that uses it stops at its end (pytest_sessionfinish, once every xdist worker is done).
    xdist workers run this one at a time: one of them starts the engine and builds the images."""
    if not _using_docker:
        users = DOCKER_USERS_LOCK.open("w")
        fcntl.flock(users, fcntl.LOCK_SH)
        _using_docker.append(users)
    with DOCKER_UP_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        running_before = _private_dockerd_running()
        up = subprocess.run([str(ROOT / ".ci" / "docker-up")], capture_output=True, text=True, timeout=180)
        if not running_before and _private_dockerd_running():
            STARTED_BY.write_text(str(_session_pid()))
    if up.returncode:
        pytest.skip(f"no Docker engine could be started here: {up.stderr.strip()}")
    host = up.stdout.strip().splitlines()[-1].partition("=")[2]
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = host  # for the docker SDK here and the batch_runner.py subprocesses
    yield host
    if previous is None:
        os.environ.pop("DOCKER_HOST", None)
    else:
        os.environ["DOCKER_HOST"] = previous


def pytest_sessionfinish(session) -> None:
    """A private dockerd a test session started is stopped by the last session that uses it (with xdist: the
    controller, at the very end): one still used by another session's tests stays up for that one to stop."""
    while _using_docker:
        _using_docker.pop().close()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        started_by = int(STARTED_BY.read_text())
    except (OSError, ValueError):
        return
    if started_by:  # a session started it (this one or another): the last one that uses it stops it
        with DOCKER_USERS_LOCK.open("w") as users:
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another session's tests use it: it stops it at its end
                return
            STARTED_BY.unlink(missing_ok=True)
            if _private_dockerd_running():
                subprocess.run([str(ROOT / ".ci" / "docker-down")], timeout=60)


def _private_dockerd_running() -> bool:
    try:
        os.kill(int(PRIVATE_DOCKERD.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True
