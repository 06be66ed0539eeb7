"""What a dataset entry made from a task folder (Harbor's format, run/task_folders.py) asks of the layers
below the run: the settings the load resolved from its task.toml and the flags, carried in the entry."""

from __future__ import annotations

from dataclasses import dataclass, field

KEY = "harbor"  # the entry's key for a task folder's name, folder, task.toml text and settings
IMAGE_PREFIX = "trajforge-harbor/"  # images built from task folders' environment/ are tagged so


@dataclass(frozen=True)
class FolderSettings:
    """A task folder's settings as the run resolved them: each timeout the file's unless the flag was
    given on the command line; each limit the lower of the file's and the flag's; network only when the
    file allows it and the run was given --sandbox_network."""

    agent_timeout: float
    verify_timeout: float
    build_timeout: float
    cpus: float = 0.0  # 0: no limit
    memory_mb: int = 0  # 0: no limit
    network: bool = False
    verifier_env: dict[str, str] = field(default_factory=dict)
    build: bool = False  # the image is built from the folder's environment/ (else docker_image as is)

    @classmethod
    def of(cls, entry: dict) -> FolderSettings | None:
        """The settings of an entry made from a task folder, or None for a JSONL entry."""
        task = entry.get(KEY)
        return cls(**task["settings"]) if isinstance(task, dict) else None


def build_log(run_dir: str, entry: dict) -> str:
    """Where a failed build of the entry's image leaves its output, in the run folder."""
    return f"{run_dir}/builds/{entry[KEY]['name']}.log"
