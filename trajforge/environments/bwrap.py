"""The bwrap environment: the local workspace, but every command runs under bubblewrap with the host
filesystem read-only, only the workspace (and a private /tmp) writable, its own PID namespace, and no
network unless --sandbox_network."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile

from trajforge.environments import OUTPUT_LIMIT, EnvironmentSettings, ExecResult, SetupError
from trajforge.environments.local import LocalBackend, LocalEnvironment, make_workspace, run_process


def bwrap_argv(settings: EnvironmentSettings, binds: list[tuple[str, str]], cwd: str, argv: list[str]) -> list[str]:
    network = ["--share-net"] if settings.sandbox_network else []
    # --die-with-parent and the PID namespace take every process of a command down with bwrap, so
    # killing bwrap's process group on a timeout kills the command's children too.
    sandbox = ["bwrap", "--unshare-all", *network, "--die-with-parent", "--new-session"]
    sandbox += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # An empty temp folder hides the other prompts' workspaces, which live there on the host.
    sandbox += ["--tmpfs", tempfile.gettempdir()]
    for source, target in binds:
        sandbox += ["--bind", source, target]
    return [*sandbox, "--chdir", cwd, "--", *argv]


class BwrapEnvironment(LocalEnvironment):
    """The local workspace, cwd and variables; each command sandboxed."""

    def __init__(self, cwd: str | None, settings: EnvironmentSettings):
        super().__init__(cwd, settings)
        self.tmp = ""  # made by start()

    async def start(self) -> None:
        await super().start()
        # /tmp is per prompt, kept between its commands; the host's /tmp (other prompts' workspaces) is hidden.
        self.tmp = await asyncio.to_thread(make_workspace, self.settings, "tmp-")

    async def run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> ExecResult:
        binds = [(self.tmp, "/tmp"), (self.workspace, self.workspace)]
        sandboxed = bwrap_argv(self.settings, binds, self.cwd, argv)
        return await run_process(sandboxed, self.workspace, self.env, timeout, stdin, limit)

    async def close(self) -> None:
        await super().close()
        if self.tmp and not self.settings.keep_workspaces:
            await asyncio.to_thread(shutil.rmtree, self.tmp, ignore_errors=True)


class BwrapBackend(LocalBackend):  # the same workspaces, so the same leftovers
    async def environment(self, entry: dict) -> BwrapEnvironment:
        return BwrapEnvironment(entry.get("cwd"), self.settings)

    @classmethod
    def check(cls, settings: EnvironmentSettings) -> None:
        if shutil.which("bwrap") is None:
            raise SetupError(
                "--environment=bwrap needs bubblewrap, which is not on PATH: install it "
                "(apt-get install bubblewrap, dnf install bubblewrap) or choose another --environment"
            )
        trial = subprocess.run(bwrap_argv(settings, [], "/", ["true"]), capture_output=True, text=True, timeout=30)
        if trial.returncode:
            raise SetupError(
                f"bwrap cannot make its sandbox on this machine ({trial.stderr.strip()}); it needs unprivileged "
                "user namespaces (sysctl kernel.unprivileged_userns_clone=1) or root"
            )
