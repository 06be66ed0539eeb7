"""Where a prompt's commands and files live. One environment per prompt, closed after it.

The contract (contract.py): an Environment has start, exec -> ExecResult, read_file, write_file and
close; a Backend (one per worker process) opens them. The backends are the registry's (trajforge/registry.py):
built in, local (a temporary workspace), bwrap (the same under bubblewrap), docker (a container per prompt),
singularity (an instance per prompt) and modal (a Sandbox per prompt); the last three use the entry's
`image` or `docker_image`.
"""

from __future__ import annotations

import posixpath
import sys
import threading
from dataclasses import replace

from trajforge import registry
from trajforge.environments.contract import Backend, Environment, ExecResult
from trajforge.environments.settings import EnvironmentSettings
from trajforge.errors import SetupError

__all__ = ["Backend", "Environment", "EnvironmentSettings", "ExecResult"]  # the contract, where callers look for it

OUTPUT_LIMIT = 32_000  # bytes of command output kept: the head and the tail, half each
FILE_LIMIT = 10_000_000  # bytes read_file will load


def image_of(entry: dict, settings: EnvironmentSettings) -> str:
    return entry.get("image") or entry.get("docker_image") or settings.default_image


def container_cwd(entry: dict, base: str) -> str:
    """The entry's `cwd` inside a container: absolute as given, relative to `base`."""
    return posixpath.normpath(posixpath.join(base, entry.get("cwd") or "."))


AUTO = "auto"  # bwrap when it works on this machine, else local with a warning


def kinds() -> tuple[str, ...]:
    """What --environment accepts: auto and every registered backend (trajforge/registry.py)."""
    return (AUTO, *registry.BACKENDS.names())


UNSANDBOXED = (
    "no sandbox: bwrap cannot work here ({reason}), so --environment=auto runs commands with "
    "--environment=local, with your own rights: they can read your files and this runner's memory, arguments "
    "and environment (the API key among them). Make bwrap work, or pass --environment=docker, to sandbox them; "
    "pass --environment=local to accept this without the warning."
)


def backend_class(kind: str) -> type[Backend]:
    return registry.BACKENDS[kind]  # imported on first use: the docker and modal SDKs load only when chosen


def choose(settings: EnvironmentSettings) -> tuple[EnvironmentSettings, str | None]:
    """The settings with --environment=auto made concrete, and the warning to print once when that
    means commands run unsandboxed. Other kinds are returned as they are."""
    if settings.kind != AUTO:
        return settings, None
    try:
        backend_class("bwrap").check(settings)
    except SetupError as exc:
        return replace(settings, kind="local"), UNSANDBOXED.format(reason=exc)
    return replace(settings, kind="bwrap"), None


def backend_for(settings: EnvironmentSettings) -> Backend:
    """The backend a worker process opens its prompts' environments with."""
    return backend_class(settings.kind)(settings)


def prepare_run(settings: EnvironmentSettings, resume: bool) -> None:
    """Before any prompt runs: fail fast (SetupError) when the backend cannot work here, and on
    --resume remove what a killed run of the same folder left behind."""
    backend_class(settings.kind).prepare_run(settings, resume)


def remove_leftovers(settings: EnvironmentSettings) -> None:
    backend_class(settings.kind).remove_leftovers(settings)


def removing_leftovers(settings: EnvironmentSettings) -> threading.Thread:
    """remove_leftovers on a thread of its own, started: at a run's end, what its workers left (the
    samples' disks, a killed worker's containers) goes while the run merges; join() it before the end."""

    def remove() -> None:
        try:
            remove_leftovers(settings)
        except SetupError:  # the engine is gone: nothing of it left to remove
            pass
        except Exception as exc:  # a backend that cannot work here (its package missing): one line, not a traceback
            print(f"warning: what earlier runs left could not be removed: {type(exc).__name__}: {exc}", file=sys.stderr)

    thread = threading.Thread(target=remove, name="leftovers")
    thread.start()
    return thread
