"""The bwrap environment: the local workspace, but every command runs under bubblewrap and sees only what
it needs: the system's directories read-only, the workspace read-write, a private /tmp and /dev/shm, a
fresh /proc and a minimal /dev, its own PID namespace, and no network unless --sandbox_network (then
the sample's own network namespace, which reaches outward only: netns.py). The
user's home, the run folder, the dataset, /run and every other place host sockets live stay out of it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import stat
import subprocess

from trajforge.environments import (
    OUTPUT_LIMIT,
    EnvironmentSettings,
    ExecResult,
    loopback,
    mountns,
    netns,
    programs,
    seccomp,
    tmpfs,
    userns,
)
from trajforge.environments.bwrap_session import CONTROL, LINE_LIMIT, Session, new_token
from trajforge.environments.contract import Spawned
from trajforge.environments.limits import MB, Limits, confined, drop_problem, host_user
from trajforge.environments.local import (
    LocalBackend,
    LocalEnvironment,
    make_workspace,
    run_process,
    spawn_process,
)
from trajforge.environments.orphans import reap_exited_orphans
from trajforge.environments.trees import below, remove_tree
from trajforge.errors import SetupError, UsageError

# Read-only where present. On merged-/usr systems /bin, /lib... are symlinks into /usr: they stay symlinks.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
SANDBOX_TMP = "/tmp"
SANDBOX_TESTS = "/tests"  # bound only for the commands after add_tests: the verification's
# Every command is this uid in a user namespace of its own, with no capability, whoever started the
# runner: no remount of the read-only system, no raw socket, no write outside the workspace and /tmp.
# What it maps to on the host is the runner's uid, or nobody when the runner is root (limits.host_user):
# never the host's root, whose uid would open /proc/sys, root-only files and setuid programs to it. The
# sample's folders are that host uid's, so the sandbox user may write them.
# A root runner's commands join the worker's two-uid namespace instead (userns.py): the agent is 1000 there too.
SANDBOX_UID = userns.AGENT_UID
UNPRIVILEGED = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
# --unshare-all but the user namespace, which --userns brings (bwrap refuses the two together).
NAMESPACES = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
# The steps before a command (sh, nsenter, bwrap) run in the C locale: in the commands' C.UTF-8 each
# of those programs loads the locale's files first, about 0.4 ms of the kernel's per command. bwrap gives
# the command its own LC_ALL back (or none): what the command sees is unchanged (chain_env, bwrap_argv).
CHAIN_LOCALE = "C"
AGENT_OVER = "not run: the agent's commands ended (the verification began while it waited for the one before)"


@functools.cache  # the host's system folders stay as they are during a run: looked at once, not per command
def system_mounts() -> tuple[str, ...]:
    mounts: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            mounts += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            mounts += ["--ro-bind", path, path]
    return tuple(mounts)


def bwrap_argv(
    settings: EnvironmentSettings,
    binds: list[tuple[str, str]],
    cwd: str,
    argv: list[str],
    read_only: tuple = (),
    identity: tuple[str, ...] = (),
    seccomp_fd: int | None = None,
    lc_all: str | None = None,
    joined_net: bool = False,
) -> list[str]:
    """bwrap's argv for `argv`: as uid 1000 in a user namespace of its own, or with `identity`
    (userns.identity: the worker's two-uid namespace), under the seccomp filter read from `seccomp_fd`,
    with the LC_ALL of the command's variables (`lc_all`, None for none) in place of its exec chain's, in
    a network namespace of its own unless the command joined the sample's (`joined_net`, --sandbox_network)."""
    share = joined_net or settings.sandbox_network
    if identity:
        unshare = [*identity, *(n for n in NAMESPACES if n != "--unshare-net" or not share)]
    else:
        unshare = ["--unshare-all", *UNPRIVILEGED, *(["--share-net"] if share else [])]
    # --die-with-parent and the PID namespace take every process of a command down with bwrap, so
    # killing bwrap's process group on a timeout kills the command's children too.
    sandbox = [programs.bwrap(), *unshare]
    if seccomp_fd is not None:
        sandbox += ["--seccomp", str(seccomp_fd)]
    sandbox += ["--die-with-parent", "--new-session"]
    sandbox += ["--setenv", "LC_ALL", lc_all] if lc_all is not None else ["--unsetenv", "LC_ALL"]
    # The root is an empty tmpfs: only what is mounted below exists, so no host socket can be reached by path.
    shm = settings.limits.max_file_size_mb  # /dev/shm is memory: bounded like one file
    sandbox += [*system_mounts(), "--dev", "/dev", "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    sandbox += [*(["--size", str(shm * MB)] if shm else []), "--tmpfs", "/dev/shm"]
    for source, target in binds:
        sandbox += ["--bind", source, target]
    for source, target in read_only:
        sandbox += ["--ro-bind", source, target]
    return [*sandbox, "--chdir", cwd, "--", *argv]


@functools.cache
def _drop_problem() -> str | None:
    """drop_problem() where this process runs, once: check() asked it of the driver, and a Ray worker's node
    may not be the driver's. A root runner's commands exec bwrap as nobody without no_new_privs and with the
    whole bounding set (limits.confined): a setuid or file-capable bwrap would be root again there."""
    if host_user() is None:
        return None
    return drop_problem() or _privileged(programs.bwrap())


def _privileged(path: str) -> str | None:
    """Why the bwrap at `path` would run with privileges of its own (setuid, setgid, file capabilities)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # none here: check() says so
    if mode & (stat.S_ISUID | stat.S_ISGID):
        return f"its bwrap ({path}) is setuid or setgid: install bubblewrap without it (a root runner needs none)"
    try:
        os.getxattr(path, "security.capability")
    except OSError:
        return None
    return f"its bwrap ({path}) has file capabilities: remove them (setcap -r) or install bubblewrap without them"


class BwrapEnvironment(LocalEnvironment):
    """The local workspace and cwd; each command sandboxed."""

    absolute_cwd = False  # only the workspace is there inside the sandbox: an absolute cwd must lie in it
    marked_leftovers = False  # nothing of a command outlives it: its PID namespace dies with it
    reuses_disk = True  # no command sees the disk's root (only the sample's folders of it are bound) nor mounts
    host_mounts = False  # each command mounts in a namespace of its own, without the host's capabilities

    def __init__(self, cwd: str | None, settings: EnvironmentSettings, sample: str = "", userns_fd: int | None = None):
        super().__init__(cwd, settings, sample)
        self.tmp = ""  # made by start()
        self.tmp_mounted = False  # a bounded tmpfs lies on it
        self.host_uid = host_user()
        # The worker's two-uid namespace for the verification's commands (the agent's are one uid, as ever),
        # or None: one uid (a runner that is not root).
        self.userns = userns_fd
        self.network: netns.SampleNetwork | None = None  # --sandbox_network: the sample's namespace
        self.loopback: loopback.Loopback | None = None  # a root runner's agent commands' network namespace
        self.session: Session | None = None  # the sandbox of the agent's commands, made at the first (bwrap_session.py)
        # One agent command at a time (also those a tool of the run's own starts together): each finds the sandbox
        # the one before left, or makes a new one where that one ended; never two sandboxes for a sample (review 28).
        self.agent_turn = asyncio.Lock()
        # Set as the verification begins (enter_clean_room), before the agent's sandbox ends: an agent command that
        # waited for the one before is refused then, in neither a new agent sandbox (which outlived the escape scan
        # and planted links and FIFOs after it) nor the clean room (the model's text as the verifier): review 30.
        self.agent_over = False

    def _prepare(self) -> None:
        super()._prepare()
        inside = os.path.relpath(self.workspace, SANDBOX_TMP)
        if self.disk is not None and not inside.startswith(".."):
            # bwrap makes the workspace's mount point in the sandbox's /tmp: made now in the agent's and the
            # clean room's, before the agent could fill the disk they share with the workspace.
            for tmp in (self.tmp, self.disk_verify):
                os.makedirs(os.path.join(tmp, inside))
        if self.disk is not None and self.disk.namespace is None:
            with contextlib.suppress(OSError):  # else its commands start in the host's, as without a disk
                argv = mountns.holder_argv(system_mounts(), [self.disk.root, self.disk.tests])
                self.disk.namespace = mountns.SlotMounts(argv).open()
        if self.settings.sandbox_network:
            try:
                self.network = netns.SampleNetwork().open()
            except OSError as exc:
                raise SetupError(f"--sandbox_network: {exc}") from None
        if self.host_uid is not None and not self.settings.sandbox_network:
            # Made with the sample, in this hop off the loop (no await to cancel between its making and its
            # keeping); where it cannot be made, each command makes its own.
            with contextlib.suppress(OSError):
                self.loopback = loopback.Loopback().open()
        if self.host_uid is not None:
            _give(self.host_uid, self.workspace, self.tmp)

    def _tmpdir(self) -> str:
        # /tmp is per prompt, kept between its commands and removed with it; the host's /tmp stays hidden.
        if self.disk is not None:  # on the sample's disk: bounded with its workspace, whatever --max_file_size_mb
            self.tmp = self.disk.make_folder("tmp")
            return SANDBOX_TMP
        self.tmp = make_workspace(self.settings, "tmp-", self.sample)
        size = tmp_size(self.settings.limits)
        if size and tmpfs.possible():  # no command fills the host's disk through it
            self.tmp_mounted = tmpfs.mount(self.tmp, size, self.host_uid)
        return SANDBOX_TMP

    @property
    def slot(self) -> mountns.SlotMounts | None:
        """The mount namespace of the sample's disk slot, where its commands' bwrap starts (none: the host's)."""
        return self.disk.namespace if self.disk is not None else None

    def confined(self, argv: list[str], joins: tuple[str, ...] = (), userns_fd: int | None = None) -> list[str]:
        """bwrap itself in the sample's cgroup and limits, in the namespaces of `joins` and the sample's
        network (joined as root: bwrap then keeps it, --share-net), and (a root runner's) as the host's
        nobody, or as root with the two-uid user namespace this process keeps at `userns_fd` open at
        userns.OPENED_AT, which bwrap joins (it must be root to)."""
        if self.network is not None:
            joins = (*joins, self.network.join())
        if userns_fd is not None:
            opens = ((userns.OPENED_AT, userns_fd),)
            return confined(argv, self.settings.limits, self.cgroup.paths, None, joins, opens)
        return confined(argv, self.settings.limits, self.cgroup.paths, self.host_uid, joins)

    def _joins(self) -> tuple[str, ...]:
        """The namespaces a command's chain enters before bwrap: the slot's mounts, an agent command's loopback."""
        slot = self.slot
        joins = (slot.join(),) if slot is not None else ()
        net = None if self.clean else self.loopback
        return (*joins, net.join()) if net is not None else joins

    def _binds(self) -> list[tuple[str, str]]:
        # There (the slot's namespace) the workspace is its folder of the disk: the host's path is a bind of it.
        workspace = self.disk_workspace if self.slot is not None else self.workspace
        # The clean room's /tmp is a fresh folder: nothing the agent left there (a link into /tests) is seen.
        return [(self.verify_tmp or self.tmp, SANDBOX_TMP), (workspace, self.workspace)]

    async def run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> ExecResult:
        self.started += 1
        if not self.clean:  # the agent's: in the sample's one sandbox
            async with self.agent_turn:
                if self.agent_over:  # it waited for the agent's last command, and the verification began since
                    return ExecResult("", -1, AGENT_OVER)
                session = await self._session()
                done = await session.run(argv, self.cwd, timeout, stdin, limit)
                reap_exited_orphans()  # a sandbox that ended: its PID-namespace init, as below
                return done
        joins = self._joins()
        binds = self._binds()
        tests = ((self.tests_host, SANDBOX_TESTS),) if self.tests_host else ()  # read-only: no one edits them
        two_uids = self.userns is not None  # the verification's: two uids where there are
        with seccomp.filter_fd() as rules:
            who = tuple(userns.identity(verifier=True)) if two_uids else ()
            lc_all = self.env.get("LC_ALL")
            sandboxed = bwrap_argv(self.settings, binds, self.cwd, argv, tests, who, rules, lc_all)
            # In the two-uid namespace bwrap itself maps the command to its host uid: it must be root to join.
            limited = self.confined(sandboxed, joins, self.userns)
            chain = chain_env(self.env)
            done = await run_process(limited, self.workspace, chain, timeout, stdin, limit, (rules,), self.clean)
        if two_uids:  # its sandbox outlives bwrap (the uid change cleared --die-with-parent): end what is left
            await self.end_leftovers()
        # bwrap's PID-namespace init outlives bwrap and, re-parented to this worker, stays a zombie that counts
        # in the sample's pids cgroup: collected within REAP_EVERY, not at the sample's end (one a command:
        # past --max_processes commands, none could fork).
        reap_exited_orphans()
        return done

    async def _session(self) -> Session:
        """The sandbox of the agent's commands: the one running, else a new one (also when the command variables
        changed since it was made, which its spawner's commands inherit)."""
        key = tuple(sorted(self.env.items()))
        if self.session is not None:
            if self.session.key == key and not self.session.ended and self.session.spawned.process.returncode is None:
                return self.session
            await self._end_session()
        control = await asyncio.to_thread(self._control_folder)
        token = new_token()
        with seccomp.filter_fd() as rules:
            reads = ((control, CONTROL),)
            argv = Session.spawner(token)
            net = self.loopback is not None
            sandboxed = bwrap_argv(
                self.settings, self._binds(), self.cwd, argv, reads, (), rules, self.env.get("LC_ALL"), net
            )
            limited = self.confined(sandboxed, self._joins())
            try:
                spawned = await spawn_process(limited, self.workspace, chain_env(self.env), LINE_LIMIT, (rules,))
            except BaseException:
                await asyncio.to_thread(remove_tree, control)
                raise
        self.session = Session(spawned, control, token, self.host_uid, key)
        return self.session

    def _control_folder(self) -> str:
        """Blocking. A new folder of the runner's for the session's control files, where its bwrap finds it: beside
        the slot's disk (its tests' folder, which the slot's namespace binds; not on the disk, whose room is the
        agent's to fill), else in the run's temporary area."""
        if self.disk is not None and self.slot is not None:
            folder = self.disk.make_folder("control", self.disk.tests)
        else:
            folder = make_workspace(self.settings, "control-")
        os.chmod(folder, 0o711)  # the sandbox's uid passes through to its files, and lists nothing
        return folder

    async def _end_session(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            await session.end()

    async def enter_clean_room(self) -> str:
        self.agent_over = True  # first: no agent command waiting for its turn starts once the agent's sandbox ends
        return await super().enter_clean_room()

    async def end_agent_processes(self) -> None:
        await self._end_session()
        await super().end_agent_processes()

    async def close(self) -> None:
        try:
            await self._end_session()
        finally:
            await super().close()

    async def spawn(
        self, argv: list[str], variables: dict[str, str], read_only: tuple[str, ...] = (), limit: int = 1 << 16
    ) -> Spawned:
        """In a sandbox of its own as the agent's commands run (one uid, their limits, network policy and
        cgroup), seeing the sample's workspace and /tmp, and `read_only` at the same paths (which the
        sandbox's host uid must be allowed to read: nobody's, when the runner is root)."""
        binds = [(self.tmp, SANDBOX_TMP), (self.workspace, self.workspace)]
        self.started += 1
        env = self.spawn_env(variables)
        with seccomp.filter_fd() as rules:
            paths = tuple((p, p) for p in read_only)
            sandboxed = bwrap_argv(self.settings, binds, self.cwd, argv, paths, (), rules, env.get("LC_ALL"))
            limited = self.confined(sandboxed)  # the sample's network namespace, as its commands join it
            return await spawn_process(limited, self.workspace, chain_env(env), limit, (rules,))

    async def clean_variables(self) -> None:
        """A fresh folder for the sandbox's /tmp (TMPDIR stays /tmp), where the clean room's HOME is made."""
        if self.verify_tmp:  # a sample's verifications share it (each makes its own HOME there)
            return
        self.verify_tmp = await asyncio.to_thread(self._verify_folder)
        self.env = {**self.env, **self.git_ceiling()}
        if self.userns is not None:  # a /tmp for both uids (sticky); the verifier's HOME in it is its own
            await asyncio.to_thread(_give, userns.VERIFIER_HOST_UID, self.verify_tmp)
            await asyncio.to_thread(os.chmod, self.verify_tmp, 0o1777)
            # The verifier's uid passes into the workspace without a capability: git checks a repository's
            # folders with access(), which ignores them. Its group is the verifier's, which no host user has.
            await asyncio.to_thread(os.chown, self.workspace, -1, userns.VERIFIER_HOST_UID)
            await asyncio.to_thread(os.chmod, self.workspace, 0o710)
            self.env = {**self.env, "AS_AGENT": userns.AS_AGENT}
        elif self.host_uid is not None:
            await asyncio.to_thread(_give, self.host_uid, self.verify_tmp)

    def _clean_home(self) -> str:
        home = super()._clean_home()
        uid = userns.VERIFIER_HOST_UID if self.userns is not None else self.host_uid
        if home and uid is not None:  # the clean room's uid's, as its mktemp made it (no agent uid renames it)
            os.lchown(home, uid, uid)
        return home and os.path.join(SANDBOX_TMP, os.path.basename(home))

    async def add_tests(self, files: dict[str, bytes]) -> None:
        await super().add_tests(files)
        if self.userns is not None:  # the verifier's alone: the agent's uid cannot even list them
            await asyncio.to_thread(_give, userns.VERIFIER_HOST_UID, self.tests_host)
            await asyncio.to_thread(os.chmod, self.tests_host, 0o700)

    def _tests_folder(self) -> str:
        # Where the slot's namespace sees it: the disk's tests folder, beside the disk, whatever room the agent
        # left on it (made now, after every process of the agent is gone).
        return (
            self.disk.make_folder("tests", self.disk.tests)
            if self.disk is not None and self.slot is not None
            else super()._tests_folder()
        )

    def _tests_path(self) -> str:
        return SANDBOX_TESTS

    def _close(self) -> None:
        super()._close()
        if self.network is not None:
            self.network.close()
        if self.loopback is not None:  # after its processes ended (super's): the namespace goes with them
            self.loopback.close()
        if self.tmp_mounted:  # a tmpfs: what it holds is gone with it (--keep_workspaces keeps none of it)
            tmpfs.unmount(self.tmp)
        if self.tmp and not self.settings.keep_workspaces:
            remove_tree(self.tmp)


def chain_env(env: dict) -> dict:
    """The variables of a command's exec chain: the command's, in the C locale (CHAIN_LOCALE)."""
    return {**env, "LC_ALL": CHAIN_LOCALE}


def tmp_size(limits: Limits) -> int:
    """MB of a /tmp off the sample's disk (a tmpfs): bounded as /dev/shm is (--max_file_size_mb), and by
    --max_disk_mb where no disk image holds it; 0 for none."""
    return min((size for size in (limits.max_file_size_mb, limits.max_disk_mb) if size), default=0)


def _give(uid: int, *folders: str) -> None:
    """The sample's fresh folders (and what start() put in them) to the sandbox's host uid."""
    for folder in folders:
        os.lchown(folder, uid, uid)
        for entry in below(folder):  # as deep as the tree goes
            os.lchown(entry.path, uid, uid)


class BwrapBackend(LocalBackend):  # the same workspaces, so the same leftovers (a /tmp may be mounted)
    async def environment(self, entry: dict, sample: str = "") -> BwrapEnvironment:
        problem = _drop_problem()
        if problem:  # the sample fails: never a command with the root runner's groups or capabilities
            raise SetupError(f"--environment=bwrap cannot run this root worker's commands as nobody: {problem}")
        return BwrapEnvironment(entry.get("cwd"), self.settings, sample, userns.namespace_fd())

    @classmethod
    def check(cls, settings: EnvironmentSettings) -> None:
        programs.bwrap()  # SetupError where it is in no absolute folder of PATH
        if settings.sandbox_network:  # exit 2, also for --environment=auto: never the host's network instead
            netns.check()
        problem = _drop_problem()
        if problem:  # exit 2, also for --environment=auto: never local's root commands instead
            raise UsageError(f"--environment=bwrap cannot run this root runner's commands as nobody: {problem}")
        try:
            with seccomp.filter_fd() as rules:
                argv = bwrap_argv(settings, [], "/", ["true"], seccomp_fd=rules)
                trial = subprocess.run(argv, capture_output=True, text=True, timeout=30, pass_fds=(rules,))
        except OSError as exc:
            raise SetupError(f"--environment=bwrap: {exc}; install libseccomp2 (apt-get install libseccomp2)") from None
        if trial.returncode:
            raise SetupError(
                f"bwrap cannot make its sandbox on this machine ({trial.stderr.strip()}); it needs unprivileged "
                "user namespaces (sysctl kernel.unprivileged_userns_clone=1) or root"
            )
