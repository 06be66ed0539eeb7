"""What every backend knows of the run: the kind, limits, image, network, the run's name and folder."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

from trajforge.environments.limits import Limits
from trajforge.flags import default


@dataclass(frozen=True)
class EnvironmentSettings:
    kind: str = "local"
    command_timeout: float = default("command_timeout")
    keep_workspaces: bool = False
    default_image: str = "python:3.11-slim"  # for prompts that name no `image` (docker, singularity, modal)
    sandbox_network: bool = False  # bwrap, docker, singularity and modal cut the network unless this is set
    run_name: str = "batch-runner"  # containers are labelled with the run so a later run can find leftovers
    run_dir: str = ""
    limits: Limits = field(default_factory=Limits)  # per sample: --max_processes, --max_memory_mb, --max_file_size_mb
    # --mcp_config names a stdio server: docker gives each sample's server a container of its own (docker.py)
    stdio_servers: bool = False

    @property
    def run_tag(self) -> str:
        """A short name-safe digest of the run folder, for backends whose names or tags must be short."""
        return hashlib.sha256(os.fsencode(self.run_dir)).hexdigest()[:12]

    def limit(self, timeout: float | None) -> float:
        """A command's time limit: what the model asked for, never more than --command_timeout."""
        return min(timeout, self.command_timeout) if timeout and timeout > 0 else self.command_timeout
