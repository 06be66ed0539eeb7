"""The local environment: a fresh temporary workspace per prompt on this machine."""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import glob
import hashlib
import os
import secrets
import signal
import stat
import subprocess
import tempfile
import termios
import time
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from trajforge.environments import OUTPUT_LIMIT, Backend, EnvironmentSettings, ExecResult, disk, liveness, loops, tmpfs
from trajforge.environments.contract import Spawned, timeout_result
from trajforge.environments.leader import Leader, end_group
from trajforge.environments.limits import MB, RUNNER, SampleCgroup, confined, host_user
from trajforge.environments.orphans import (
    PROMPT_MARKER,
    become_subreaper,
    commands_running,
    end_marked,
    reap,
    reap_exited_orphans,
    starting_command,
)
from trajforge.environments.shell import CommandEnvironment
from trajforge.environments.trees import plain, remove_tree
from trajforge.errors import SetupError
from trajforge.tail import CappedOutput

# What every command sees besides PATH, HOME and TMPDIR; nothing of ours (API keys stay out of trajectories).
COMMAND_VARIABLES = {"LANG": "C.UTF-8", "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
# The system's, not the runner's: a virtualenv's bin or pyenv shims first would hand commands our Python.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Said at the start of a root runner's verified local run: its cgroup and its marker end a sample's processes
# before verification, but a root command may leave the one and drop the other (env -i).
ROOT_LOCAL_VERIFIED = (
    "--environment=local as root: a command that leaves its sample's cgroup and drops its marker (env -i) can "
    "live on into the verification and change what it checks; verify with bwrap or docker (docs/sandbox.md)"
)
TERM_GRACE = 2.0  # seconds a timed-out command's processes get to end after SIGTERM, before SIGKILL
# Threads that remove a run's leftovers: a worker slot's disk (unmounted, its image deleted) is mostly
# waiting on the kernel, and a run's end leaves one per slot, hundreds.
REMOVERS = 64
UNMOUNT_ROUNDS = 64  # mount table reads at a run's end, each after letting go of what the one before listed


async def run_process(
    argv: list[str],
    cwd: str,
    env: dict,
    timeout: float,
    stdin: bytes | None = None,
    limit: int = OUTPUT_LIMIT,
    pass_fds: tuple[int, ...] = (),
    own_output: bool = False,
) -> ExecResult:
    """Run argv in its own process group, feeding it `stdin`; on timeout (or cancellation) end the whole
    group: SIGTERM, then SIGKILL for what is still there after TERM_GRACE. No preexec_fn, ever: CPython
    then vfork()s instead of forking the whole worker (what a command's process does first is in its
    argv: limits.confined). `pass_fds` are descriptors the command inherits (bwrap's filter and namespace).
    With `own_output` (a verification's command) the result is what was written before argv's own process
    exited, not what processes it left behind write later (the caller ends those); else output is read until
    its pipe closes. Its first process is collected only once its group is done with (leader.py)."""
    output = CappedOutput(limit)
    pipe = OutputPipe(output)
    fed = None
    try:  # the stdin pipe too: one that could not be made (EMFILE) left the output pipe open (review 31)
        if stdin is not None:
            fed = os.pipe2(os.O_CLOEXEC)
        with starting_command():
            popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL if fed is None else fed[0],
                stdout=pipe.write_end,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=pass_fds,
            )
            commands_running[popen.pid] = env.get(PROMPT_MARKER, "")
    except BaseException:
        for fd in (pipe.write_end, pipe.read_end, *(fed or ())):
            os.close(fd)
        raise
    leader = Leader(popen)
    pipe.started()
    if fed is not None:
        os.close(fed[0])  # the command holds it now
    return await _run(leader, pipe, output, timeout, None if fed is None else (fed[1], stdin or b""), own_output)


async def spawn_process(argv: list[str], cwd: str, env: dict, limit: int, pass_fds: tuple[int, ...] = ()) -> Spawned:
    """Start argv in its own process group with stdin, stdout and stderr as pipes, and leave it running;
    its `end` ends the group as a timed-out command's is ended."""
    pipe = asyncio.subprocess.PIPE
    loop = asyncio.get_running_loop()
    with starting_command():
        transport, protocol = await loop.subprocess_exec(
            lambda: _Collected(env.get(PROMPT_MARKER, ""), limit, loop),
            *argv,
            cwd=cwd,
            env=env,
            stdin=pipe,
            stdout=pipe,
            stderr=pipe,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    return Spawned(proc, lambda: asyncio.shield(_end_spawned(proc)))


class _Collected(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol of a spawned process, which holds its number in orphans.commands_running from its start
    until asyncio collected it, not until its `end`: from then on the number may be another process's, and a prompt
    whose daemon took it (re-parented to the worker) walked past it at its end as another prompt's running command,
    everything below it too (review 34); and a late removal could forget another command that got the number."""

    def __init__(self, marker: str, limit: int, loop: asyncio.AbstractEventLoop):
        super().__init__(limit, loop)
        self.marker = marker
        self.pid = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Before the start returns, and before process_exited (asyncio holds that back until now)."""
        super().connection_made(transport)
        self.pid = cast(asyncio.SubprocessTransport, transport).get_pid()
        commands_running[self.pid] = self.marker

    def process_exited(self) -> None:
        """Collected by asyncio's watcher a moment ago (on its thread, which then calls this on the loop's)."""
        commands_running.pop(self.pid, None)
        super().process_exited()


async def _end_spawned(proc: asyncio.subprocess.Process) -> None:
    """Its group ended, SIGTERM then SIGKILL, only while its leader is not collected: once asyncio has collected
    it (a server that ended by itself, also on its stdin's end), its number is free and may lead another
    process's group by then (another sample's command, a host process), which a signal or a wait for that group
    would end or reap (review 29, as review 28's sandbox). What the group left, or started outside it, the
    sample's cgroup or marker ends (local), or its PID namespace did (bwrap). Its number left
    orphans.commands_running as asyncio collected it (_Collected)."""
    if leads_its_group(proc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), TERM_GRACE)
    if leads_its_group(proc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


def leads_its_group(proc: asyncio.subprocess.Process) -> bool:
    """Whether the number of `proc`, a group leader started here, is still its own: it runs, or is a zombie no one
    collected. asyncio's watcher collects it before it sets `returncode` (in a later callback, or on a thread
    of its own): a child the kernel no longer has for ours (waitid without collecting it) is gone too."""
    if proc.returncode is not None:
        return False
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


class OutputPipe:
    """A command's stdout and stderr: read as it comes, on the event loop, into `output`. A new pipe, or the
    read end of one made elsewhere (`read_end`, non-blocking: bwrap_session's FIFO)."""

    def __init__(self, output: CappedOutput, read_end: int | None = None):
        self.output = output
        self.read_end, self.write_end = os.pipe2(os.O_CLOEXEC) if read_end is None else (read_end, -1)
        self.closed = asyncio.get_running_loop().create_future()  # every writer is gone

    def started(self, per_wake: int = 1 << 62) -> None:
        """Read from now on, at most `per_wake` bytes each time the event loop finds it readable."""
        if self.write_end >= 0:
            os.close(self.write_end)  # the command holds it now
        os.set_blocking(self.read_end, False)
        asyncio.get_running_loop().add_reader(self.read_end, self.read, per_wake)

    def read(self, at_most: int = 1 << 62) -> bool:
        """What the pipe holds, up to `at_most` bytes; whether every writer is gone (nothing more to read)."""
        while at_most > 0:
            try:
                chunk = os.read(self.read_end, min(65536, at_most))
            except BlockingIOError:
                return False
            if not chunk:  # every writer is gone: no more to wait for (an end of file stays readable)
                asyncio.get_running_loop().remove_reader(self.read_end)
                if not self.closed.done():
                    self.closed.set_result(None)
                return True
            at_most -= len(chunk)
            self.output.feed(chunk)
        return False

    def take_written(self) -> None:
        """At the command's exit: what lies in the pipe now was written before it (FIONREAD counts it);
        what its leftovers write from here on is never read."""
        pending = array.array("i", [0])
        fcntl.ioctl(self.read_end, termios.FIONREAD, pending)
        self.read(pending[0])

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.read_end)
        os.close(self.read_end)


async def _run(
    leader: Leader,
    pipe: OutputPipe,
    output: CappedOutput,
    timeout: float,
    stdin: tuple[int, bytes] | None,
    own_output: bool,
) -> ExecResult:
    async def feed() -> None:
        if stdin is not None:  # until its first process exits, as asyncio did: a leftover need not read it all
            await write_all(*stdin, until=leader.exited)

    async def finish() -> int:
        if own_output:
            code = (await asyncio.gather(feed(), leader.wait()))[1]
            pipe.take_written()
            return code
        await asyncio.gather(feed(), pipe.closed)
        return await leader.wait()  # its output may close long before it ends: the limit covers both

    ended = False  # by itself, within its limit
    try:
        code = await asyncio.wait_for(finish(), timeout)
        ended = True
        return ExecResult(output.text(), code)
    except TimeoutError:
        return timeout_result(output.text(), timeout)
    finally:
        pipe.close()
        if ended:
            leader.collect()
        else:  # shielded: a prompt cancelled meanwhile still ends the group and collects its leader
            await asyncio.shield(_end_command(leader))


async def _end_command(leader: Leader) -> None:
    """Timed out or cancelled: the whole group goes, also a background child that outlived the shell."""
    try:
        await end_group(leader, TERM_GRACE)
    finally:
        leader.collect()


async def write_all(fd: int, data: bytes, until: asyncio.Future | None = None) -> None:
    """`data` written to the pipe `fd` as the command reads it (all of it, or until it closes its end, or until
    `until` is done: its first process exited), then the pipe closed: the command's stdin. A process it left
    behind holding its stdin, unread, kept its result waiting to the time limit (review 31)."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    try:
        os.set_blocking(fd, False)
        while view and not (until is not None and until.done()):
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                writable = loop.create_future()
                loop.add_writer(fd, writable.set_result, None)
                try:
                    waits = {writable} if until is None else {writable, until}
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    loop.remove_writer(fd)
    except (BrokenPipeError, ConnectionResetError):  # it may not read it all
        pass
    finally:
        os.close(fd)


def workspace_prefix(settings: EnvironmentSettings) -> str:
    """Temporary folders of one run start with this, so a later run can remove what a killed one left."""
    return f"batch-runner-{settings.run_tag}-"


def cgroup_prefix(settings: EnvironmentSettings) -> str:
    """The run's samples' cgroups start with this: the workspace prefix and a digest of the temporary folder.
    Cgroups are the machine's, markers the temporary folder's: a run resumed with another TMPDIR holds its marker
    there, and another run's start that found its old marker unheld in the first folder killed the live run's
    commands and removed their cgroups (review 20). That start ends only the cgroups made with its folder."""
    here = hashlib.sha256(os.fsencode(os.path.realpath(tempfile.gettempdir()))).hexdigest()[:8]
    return f"{workspace_prefix(settings)}{here}-"


def make_workspace(settings: EnvironmentSettings, kind: str = "", name: str = "") -> str:
    """A new private folder for one prompt. Named `name` (the sample's) when given, so a re-run of the
    sample shows the model the same paths and its calls are answered from the response cache; what a
    killed attempt left there is removed first (kept with --keep_workspaces: a random name then)."""
    liveness.hold(settings)  # before anything of the run's is made here: no other run's start removes it
    prefix = workspace_prefix(settings) + kind
    if name:
        path = os.path.join(tempfile.gettempdir(), prefix + name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
            return path
        if not settings.keep_workspaces and _own_directory(path) and _let_go_below(path):
            remove_tree(path)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
                return path
    return tempfile.mkdtemp(prefix=prefix)


def _let_go_below(*paths: str) -> bool:
    """Whether nothing is mounted on or below `paths` any more: a root runner's local commands mount in the
    host's namespace (a killed attempt's too), and what they left there is unmounted (tmpfs.detach_below), so
    that removing the paths removes only their own files."""
    if tmpfs.possible():
        try:
            tmpfs.detach_below(list(paths))
        except OSError:
            return False
    return True


def _own_directory(path: str) -> bool:
    """A real directory of ours, not a symlink or someone else's folder planted in a shared /tmp."""
    info = os.lstat(path)
    return stat.S_ISDIR(info.st_mode) and info.st_uid in (os.getuid(), host_user())  # bwrap's are nobody's


def command_env(home: str, tmpdir: str) -> dict:
    """The variables a command on this machine sees: none of the runner's own (VIRTUAL_ENV, PYTHONPATH, keys)."""
    return {"PATH": SYSTEM_PATH, "HOME": home, "TMPDIR": tmpdir, **COMMAND_VARIABLES}


def workspace_cwd(workspace: str, cwd: str | None, absolute_ok: bool) -> str:
    """The entry's `cwd`: relative ones inside the workspace; an absolute one as given where the host's
    folders are visible (absolute_ok), else only when it lies in the workspace. SetupError otherwise."""
    path = os.path.normpath(os.path.join(workspace, cwd or "."))
    if os.path.isabs(cwd or "") and absolute_ok:
        if not os.path.isdir(path):
            raise SetupError(f"cwd {cwd!r} does not exist on this machine (local environment)")
        return path
    if os.path.commonpath([workspace, path]) != workspace:
        raise SetupError(f"cwd {cwd!r} is outside the prompt's workspace")
    return path


def write_tests(root: str, files: dict[str, bytes]) -> str:
    """`root`, a fresh host folder, holding `files` (their paths were checked at load: none leaves it)."""
    os.chmod(root, 0o755)  # readable by the sandbox's user (bound read-only), written by no one but us
    for name, data in files.items():
        *folders, file = os.path.normpath(name).split(os.sep)
        path = root
        for folder in folders:  # one level at a time: os.makedirs recurses once per level (Python 3.11)
            path = os.path.join(path, folder)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
        with open(os.path.join(path, file), "wb") as handle:
            handle.write(data)
    return root


class LocalEnvironment(CommandEnvironment):
    """A fresh temporary workspace on this machine; commands run there (or in the entry's `cwd`)."""

    absolute_cwd = True  # an absolute `cwd` is taken as it is: commands see the host's folders
    marked_leftovers = True  # a command's daemon may outlive it: found by its marker where no cgroup holds it
    # A disk goes with its sample: its commands run as the runner (often root), which reaches the disk's root,
    # its image and the host's mounts, and could leave the next sample a disk that looks whole and is not
    # (a reserve that frees nothing, blocks kept by a loop device, a noexec mount stacked on it: reviews 5-9).
    reuses_disk = False
    host_mounts = True  # its commands run in the host's mount namespace: a root one mounts there (detach_below)

    def __init__(self, cwd: str | None, settings: EnvironmentSettings, sample: str = ""):
        self.settings = settings
        self.sample = sample  # names the workspace
        self.asked_cwd = cwd
        self.workspace = self.cwd = ""  # made by start()
        self.env: dict = {}
        self.token = secrets.token_hex(16)  # marks every process of this prompt (orphans.py)
        self.tests_host = ""  # the hidden tests' folder on this machine, made only by add_tests
        self.verify_tmp = ""  # the clean room's TMPDIR, outside the workspace (clean_variables)
        # The sample's processes and memory, where cgroups work; also how its processes are found at its end.
        self.cgroup = SampleCgroup(settings.limits, cgroup_prefix(settings))
        self.started = 0  # commands started since the sample's processes were last ended
        self.disk: disk.Disk | None = None  # where the workspace and the clean room's /tmp lie (--max_disk_mb)
        self.disk_workspace = ""  # the workspace's folder on it, bound on self.workspace
        self.disk_verify = ""  # the clean room's /tmp on it, made before the agent could fill the disk

    async def start(self) -> None:
        """One hop off the loop for all of it. Cancelled, it still waits for that hop to end: the thread goes
        on making the sample's disk, namespaces and folders, which close() (Backend.open's, right after) must
        find made, not run beside their making and miss them (review 15: each leaked for the worker's life)."""
        prepared = asyncio.ensure_future(asyncio.to_thread(self._prepare))
        try:
            await asyncio.shield(prepared)
        except asyncio.CancelledError:
            while not prepared.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({prepared})
            with contextlib.suppress(BaseException):  # what it raised is moot: the open was cancelled
                prepared.result()
            raise

    def _prepare(self) -> None:
        self.workspace = make_workspace(self.settings, "", self.sample)
        if self.settings.limits.max_disk_mb and disk.possible():
            self.disk = disk.take(self.settings, workspace_prefix(self.settings))
            self.disk_workspace = self.disk.make_folder("workspace")
            self.disk_verify = self.disk.make_folder("verify")
            self.disk.attach(self.disk_workspace, self.workspace)
        self.cwd = workspace_cwd(self.workspace, self.asked_cwd, self.absolute_cwd)
        os.makedirs(self.cwd, exist_ok=True)
        self.env = {**command_env(self.workspace, self._tmpdir()), PROMPT_MARKER: self.token}
        self.cgroup.make()

    async def verification_ahead(self, verified: bool) -> None:
        if self.disk is not None:
            await asyncio.to_thread(self._keep_room, verified)

    def _keep_room(self, verified: bool) -> None:
        """Blocking. The verification's reserve on the sample's fresh (or emptied) disk, for a sample that will
        be verified (1 ms of CPU; under bwrap one kept from an earlier sample of the slot is used again); for
        one that will not, none: a kept one goes, so that every unverified sample has the whole disk."""
        assert self.disk is not None
        if not verified:
            self.disk.release()
            return
        try:
            self.disk.reserve()
        except OSError as exc:  # on a disk with nothing of the sample's on it yet: the flag's size, or the host
            room = f"{disk.RESERVE_BYTES // MB} MB and {disk.RESERVE_FILES} inodes"
            raise SetupError(f"--max_disk_mb: cannot keep the verification's reserve ({room}): {exc}") from None

    async def agent_begins(self, verified: bool) -> None:
        # The record's command only where a pack folder may lie: what it hashes is below one (a whole sandboxed
        # command, ~9 ms of CPU in bwrap, for the many workspaces that hold no repository).
        await super().agent_begins(verified and await asyncio.to_thread(may_hold_packs, self.scan_root))
        # The workspace's files are on this machine's kernel, whose clock sets their ctime; a cwd of the
        # host's held files before the sample (any earlier process could have written them): all are checked.
        if os.path.commonpath([self.cwd, self.workspace]) == self.workspace:
            self.agent_since = int(time.time()) - 1  # a second early: a file's ctime is a coarse clock's

    def _tmpdir(self) -> str:
        """TMPDIR for the prompt's commands: in its workspace, so its files go with it, not in the host's /tmp."""
        tmpdir = os.path.join(self.workspace, ".tmp")
        os.mkdir(tmpdir)
        return tmpdir

    def confined(self, argv: list[str]) -> list[str]:
        """argv as the sample's process runs it: in its cgroup, under its file size limit."""
        return confined(argv, self.settings.limits, self.cgroup.paths)

    async def run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> ExecResult:
        self.started += 1
        done = await run_process(self.confined(argv), self.cwd, self.env, timeout, stdin, limit, own_output=self.clean)
        await self.end_leftovers()
        return done

    async def spawn(
        self, argv: list[str], variables: dict[str, str], read_only: tuple[str, ...] = (), limit: int = 1 << 16
    ) -> Spawned:
        self.started += 1  # ended with the sample's commands (its cgroup, else its marker) at the latest
        return await spawn_process(self.confined(argv), self.cwd, self.spawn_env(variables), limit)

    def spawn_env(self, variables: dict[str, str]) -> dict:
        """A command's variables with `variables` over them; the sample's marker stays."""
        return {**self.env, **variables, PROMPT_MARKER: self.token}

    async def end_leftovers(self) -> None:
        """After a clean room's command: what it left running (a daemon of the model's code it ran) ends."""
        if self.clean:
            await self.end_agent_processes()

    @property
    def scan_root(self) -> str:
        return self.workspace

    async def remove_escapes(self) -> str:
        # Looked at from here first, every process of the agent's gone (enter_clean_room): a workspace of folders
        # and regular files alone, none named .git, holds nothing the scan would remove or neutralise, and the
        # scan's command (a clean room's whole sandbox under bwrap) is not run.
        if await asyncio.to_thread(self._plain):
            return self.removed_note([])
        return await super().remove_escapes()

    def _plain(self) -> bool:
        """Blocking. The sample's processes ended once more first, as after the scan's command (end_leftovers):
        what outlived the first ending (a fork storm past the cgroup's rounds of kills) does not outlive this."""
        self._end_processes()
        return plain(self.scan_root, PLAIN_AT_MOST)

    async def end_agent_processes(self) -> None:
        if self.started:  # nothing started since the last time: nothing to end
            await asyncio.to_thread(self._end_processes)

    def _end_processes(self) -> None:
        """Blocking. Through the sample's cgroup where it has one: its members are exactly the sample's
        processes, also a daemon that dropped the marker (`env -i`) or ignores signals; else the marked
        ones among this worker's descendants (orphans.py), never a scan of every process of the host."""
        self.started = 0
        if self.cgroup.paths:
            reap(self.cgroup.kill())
        if self.marked_leftovers:  # also with a cgroup: a root command can move itself out of it
            end_marked(self.token)
        reap_exited_orphans()

    async def clean_variables(self) -> None:
        # The clean room's HOME is made below TMPDIR: here a fresh folder outside the workspace.
        if not self.verify_tmp:  # each verification's HOME is a fresh folder in it (shell.CLEAN_SHELL)
            self.verify_tmp = await asyncio.to_thread(self._verify_folder)
        self.env = {**self.env, "TMPDIR": self.verify_tmp, **self.git_ceiling()}

    async def clean_home(self) -> str:
        return await asyncio.to_thread(self._clean_home)

    def _clean_home(self) -> str:
        """Blocking. A new folder in the clean room's TMPDIR (mode 0700, as mktemp makes it); "" where none can be
        made (a full disk: the command's mktemp fails alike, exit 125)."""
        try:
            return tempfile.mkdtemp(dir=self.verify_tmp) if self.verify_tmp else ""
        except OSError:
            return ""

    def git_ceiling(self) -> dict[str, str]:
        """Git in the clean room looks for a repository no higher than the workspace: its parent (the host's
        /tmp, bwrap's clean room /tmp) is no folder the clean room neutralised, and code the verify command runs
        as the agent may write a repository there whose config git would obey (a filter run as the verifier)."""
        return {"GIT_CEILING_DIRECTORIES": os.path.dirname(self.workspace)}

    async def add_tests(self, files: dict[str, bytes]) -> None:
        # The folder is made only now, after every process of the agent is gone: none could have watched for it.
        await self.end_agent_processes()
        self.tests_host = await asyncio.to_thread(lambda: write_tests(self._tests_folder(), files))
        self.tests_dir = self._tests_path()
        self.env["TESTS_DIR"] = self.tests_dir

    def _tests_folder(self) -> str:
        """A fresh folder for the hidden tests, outside the workspace."""
        return make_workspace(self.settings, "tests-")

    def _verify_folder(self) -> str:
        """The clean room's /tmp: on the sample's disk where it has one, bounded together with the workspace
        (what the verification writes there must fit in what the agent left, and in the reserve, given
        back now that no process of the agent's runs)."""
        if self.disk is not None:
            self.disk.release()
        return self.disk_verify or make_workspace(self.settings, "verify-")

    def _tests_path(self) -> str:
        return self.tests_host

    async def close(self) -> None:
        await asyncio.to_thread(self._close)  # off the event loop: removing a big workspace takes a while

    def _close(self) -> None:
        if self.started:
            self._end_processes()
        self.cgroup.remove()
        folders = [self.verify_tmp] + ([] if self.settings.keep_workspaces else [self.workspace, self.tests_host])
        # A kept workspace too: what is kept is the sample's files, not a host folder bound among them. Else the
        # folders on the sample's disk go with its unmounting, which is lazy and so takes what lies mounted below
        # along, without a read of the host's whole mount table at each sample's end (hundreds of lines). The
        # clean room's /tmp on it so too with --keep_workspaces (review 33: walked after the disk's unmounting
        # let go of what a root command stacked on its root, it was the host folder bound below it).
        on_disk = {self.disk_verify} | ({self.workspace} if not self.settings.keep_workspaces else set())
        on_disk = on_disk if self.disk else set()
        every = [folder for folder in (self.verify_tmp, self.workspace, self.tests_host) if folder not in on_disk]
        if self.host_mounts and any(every) and not _let_go_below(*filter(None, every)):
            folders = []  # still mounted: its folders stay (the run's end unmounts its leftovers first)
        if self.disk is not None:
            unbound = self._leave_disk()
            # What lay on the disk went with it (dropped, or emptied by give_back), never walked again here;
            # the workspace's path is the empty host folder it was bound on, removed only so: a root command
            # can unbind the disk, mount a host folder below that path and bind the disk over it again (or
            # stack more mounts there than unmount lets go of), and rmtree would empty that folder.
            folders = [folder for folder in folders if folder not in on_disk]
            if unbound and self.workspace in on_disk:
                with contextlib.suppress(OSError):  # not empty: it stays for the run's end (remove_leftovers)
                    os.rmdir(self.workspace)
        for folder in filter(None, folders):
            remove_tree(folder)

    def _leave_disk(self) -> bool:
        """The workspace's path unbound (with --keep_workspaces, the files copied there), the disk given back
        for the next sample of the slot, or dropped; whether nothing is mounted on the workspace's path any more
        (else what a command stacked there is not written into)."""
        assert self.disk is not None
        unbound = tmpfs.unmount(self.workspace)
        try:
            # Not after remove_leftovers (its folder gone), nor into what a command stacked on the path.
            if unbound and self.settings.keep_workspaces and os.path.isdir(self.disk_workspace):
                disk.copy_files(self.disk_workspace, self.workspace, self.disk.device)
        finally:
            if self.reuses_disk:
                disk.give_back(self.disk, self.settings)
            else:
                self.disk.drop()
            self.disk = None
        return unbound


PLAIN_AT_MOST = 2_000  # entries of a workspace looked at before the clean room's scan at most: past them, it runs
LOOKED_AT = 20_000  # entries looked at for a pack folder at most: past them, there may be one


def may_hold_packs(root: str) -> bool:
    """Whether a folder `objects/pack` may lie below `root` (PACKS_SCRIPT's find records the files of such
    folders alone): False when none does, links not followed, as find does not follow them. Folders named
    .git and objects are looked in first; a tree of more than LOOKED_AT entries is taken to hold one."""
    below, seen = [root], 0
    while below:
        folder = below.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError:  # gone, or not a folder: it holds no pack folder that find would read either
            continue
        seen += len(entries)
        folders = [entry for entry in entries if entry.is_dir(follow_symlinks=False)]
        if os.path.basename(folder) == "objects" and any(entry.name == "pack" for entry in folders):
            return True
        if seen > LOOKED_AT:
            return True
        below += sorted((entry.path for entry in folders), key=lambda path: path.endswith(("/.git", "/objects")))
    return False


class LocalBackend(Backend):
    LIMITS = RUNNER

    def __init__(self, settings: EnvironmentSettings):
        super().__init__(settings)
        become_subreaper()  # this worker process adopts its prompts' orphans (orphans.py)

    @classmethod
    def check(cls, settings: EnvironmentSettings) -> None:
        """A temporary folder and `sh` are all it needs: it works wherever this program runs."""

    @classmethod
    def prepare_run(cls, settings: EnvironmentSettings, resume: bool) -> None:
        """Also what the runs that are gone from this machine left in its temporary folder (liveness.py); this
        process holds its own run's marker from now on (its workers, forked, too), idle workers or none."""
        liveness.hold(settings)
        super().prepare_run(settings, resume)
        liveness.sweep(settings, LocalBackend.remove_gone)

    async def environment(self, entry: dict, sample: str = "") -> LocalEnvironment:
        return LocalEnvironment(entry.get("cwd"), self.settings, sample)

    @classmethod
    def remove_leftovers(cls, settings: EnvironmentSettings) -> None:
        """Its own run's (a --resume, the run's end): its cgroups made with any temporary folder."""
        LocalBackend._remove(settings, workspace_prefix(settings))

    @classmethod
    def remove_gone(cls, settings: EnvironmentSettings) -> None:
        """Another run's, gone from this temporary folder (liveness.sweep): only the cgroups made with this folder,
        for the run may go on with another one (cgroup_prefix)."""
        LocalBackend._remove(settings, cgroup_prefix(settings))

    @staticmethod
    def _remove(settings: EnvironmentSettings, cgroups: str) -> None:
        SampleCgroup.remove_leftovers(cgroups)
        # Through no symlink (a TMPDIR that is one): /proc/self/mounts names the folders so.
        temporary = os.path.realpath(tempfile.gettempdir())
        mounted = os.path.join(temporary, workspace_prefix(settings))
        if settings.keep_workspaces:
            disk.keep_workspaces_below(mounted)
        with ThreadPoolExecutor(REMOVERS) as pool:
            # Unmounted first (bwrap's /tmp, the samples' disks), then their folders removed: in rounds, each
            # mount table read again, until none is left below or a round lets go of none. A point is unmounted
            # through its path, which a root command's mount over a folder above it (a disk's folder) answers:
            # the disk below read as gone, and so did a host folder bound on it, both there again once the
            # cover went, and emptied with the folder (review 33). What is still listed stays.
            stay = [point for point, _ in tmpfs.mounted_below(mounted)]
            for _ in range(UNMOUNT_ROUNDS):
                if not stay:
                    break
                list(pool.map(tmpfs.unmount_listed, sorted(set(stay), key=len)))
                left = [point for point, _ in tmpfs.mounted_below(mounted)]
                stay, went = left, len(left) < len(stay)
                if not went:
                    break
            loops.let_go(mounted)  # once nothing of the run is mounted where its paths reach (loops.py)
            # The disks' images go in any case (kept workspaces were copied off theirs first); never a folder
            # with something still mounted below it (rmtree would empty that too).
            kept = "disk-*" if settings.keep_workspaces else "*"
            folders = glob.glob(os.path.join(glob.escape(temporary), glob.escape(workspace_prefix(settings)) + kept))
            list(pool.map(remove_tree, [f for f in folders if not any(f"{p}/".startswith(f"{f}/") for p in stay)]))
