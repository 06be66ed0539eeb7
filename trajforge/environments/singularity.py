"""The singularity environment: one apptainer (or singularity) instance per prompt from a docker://
image, with a fresh workspace on this machine bound at /workspace.

Untested against a real apptainer (none on the machine this was written on): built from the CLI's
documented `instance start`, `exec --pwd` and `instance stop`; its tests cover the arguments and errors.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid

from trajforge.environments import OUTPUT_LIMIT, Backend, EnvironmentSettings, ExecResult, container_cwd, image_of
from trajforge.environments.local import LocalBackend, command_env, make_workspace, run_process
from trajforge.environments.shell import CommandEnvironment
from trajforge.environments.trees import remove_tree
from trajforge.errors import SetupError

BINARIES = ("apptainer", "singularity")
WORKSPACE = "/workspace"
START_TIMEOUT = 900.0  # the first start of an image pulls and converts it


def find_binary() -> str | None:
    return next((name for name in BINARIES if shutil.which(name)), None)


def image_uri(image: str) -> str:
    """Docker image names become docker:// URIs; other URIs and .sif files stay as they are."""
    return image if "://" in image or image.endswith(".sif") else f"docker://{image}"


def instance_prefix(settings: EnvironmentSettings) -> str:
    return f"batch-runner-{settings.run_tag}"


def start_argv(binary: str, settings: EnvironmentSettings, image: str, name: str, workspace: str) -> list[str]:
    # --containall: no host home, /tmp or environment variables; own PID and IPC namespaces.
    network = [] if settings.sandbox_network else ["--net", "--network", "none"]
    bind = ["--bind", f"{workspace}:{WORKSPACE}"]
    return [binary, "instance", "start", "--containall", "--writable-tmpfs", *network, *bind, image_uri(image), name]


def exec_argv(binary: str, name: str, cwd: str, argv: list[str]) -> list[str]:
    return [binary, "exec", "--cleanenv", "--pwd", cwd, f"instance://{name}", *argv]


class SingularityEnvironment(CommandEnvironment):
    def __init__(self, binary: str, image: str, cwd: str, settings: EnvironmentSettings):
        self.binary, self.image, self.cwd, self.settings = binary, image, cwd, settings
        self.name = f"{instance_prefix(settings)}-{uuid.uuid4().hex[:8]}"
        self.workspace = ""  # made by start()
        self.env: dict = {}

    async def start(self) -> None:
        self.workspace = await asyncio.to_thread(make_workspace, self.settings)
        self.env = command_env(self.workspace, "/tmp")  # apptainer's own; --containall keeps them from commands
        argv = start_argv(self.binary, self.settings, self.image, self.name, self.workspace)
        started = await run_process(argv, self.workspace, self.env, START_TIMEOUT)
        if started.error or started.exit_code:
            reason = (started.error or started.output).strip()[-2000:]
            raise SetupError(f"{self.binary} cannot start an instance of {self.image!r}: {reason}")
        made = await run_process(
            exec_argv(self.binary, self.name, "/", ["mkdir", "-p", "--", self.cwd]), self.workspace, self.env, 60
        )
        if made.error or made.exit_code:
            raise SetupError(f"cannot create cwd {self.cwd!r} in {self.image!r}: {made.output.strip()}")

    async def run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int = OUTPUT_LIMIT
    ) -> ExecResult:
        wrapped = exec_argv(self.binary, self.name, self.cwd, argv)
        return await run_process(wrapped, self.workspace, self.env, timeout, stdin, limit)

    async def close(self) -> None:
        if not self.workspace:  # never started
            return
        await run_process([self.binary, "instance", "stop", "--force", self.name], self.workspace, self.env, 60)
        if not self.settings.keep_workspaces:
            await asyncio.to_thread(remove_tree, self.workspace)


class SingularityBackend(Backend):
    async def environment(self, entry: dict, sample: str = "") -> SingularityEnvironment:
        binary = find_binary()
        if binary is None:
            raise SetupError(_MISSING)
        cwd = container_cwd(entry, WORKSPACE)
        return SingularityEnvironment(binary, image_of(entry, self.settings), cwd, self.settings)

    @classmethod
    def check(cls, settings: EnvironmentSettings) -> None:
        if find_binary() is None:
            raise SetupError(_MISSING)

    @classmethod
    def remove_leftovers(cls, settings: EnvironmentSettings) -> None:
        binary = find_binary()
        if binary:  # `instance stop` takes a glob; it fails harmlessly when nothing matches
            pattern = f"{instance_prefix(settings)}-*"
            subprocess.run([binary, "instance", "stop", "--force", pattern], capture_output=True, timeout=120)
        LocalBackend.remove_leftovers(settings)  # the workspaces bound into the instances


_MISSING = (
    "--environment=singularity needs apptainer (or singularity) on PATH; install it "
    "(https://apptainer.org/docs/admin/main/installation.html) or choose another --environment"
)
