"""The run's settings, one frozen value built once from the flags (trajforge.cli.config) and passed down:
the worker, the runner, the exporters and verification read it; nothing here reads the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trajforge.environments.settings import EnvironmentSettings
from trajforge.flags import default
from trajforge.model.settings import NO_KEY, JudgeEndpoint, ModelSettings
from trajforge.money.spending import MoneySettings
from trajforge.plugins import Plugin
from trajforge.secrets import Secrets
from trajforge.tools.mcp.servers import Server
from trajforge.tools.settings import ToolSettings
from trajforge.verification.result import VerifySettings


@dataclass(frozen=True)
class RunConfig:
    dataset_file: Path
    batch_size: int
    run_name: str
    run_dir: Path
    distribution: str
    model: ModelSettings
    environment: EnvironmentSettings
    tools: ToolSettings
    max_turns: int = default("max_turns")
    # Calls of one reply that run (the others are answered with an error); seconds for a whole session.
    max_tool_calls_per_turn: int = default("max_tool_calls_per_turn")
    prompt_timeout: float = default("prompt_timeout")
    num_workers: int = default("num_workers")
    concurrency: int = default("concurrency")
    min_free_disk_mb: int = default("min_free_disk_mb")
    resume: bool = False
    dry_run: bool = False  # the run's checks, then what it would do; no chat request (run/dry_run.py)
    verbose: bool = False
    max_samples: int | None = None
    task_root: tuple[Path, ...] | None = None  # folders a task's workspace and tests may lie in, besides the dataset's
    log_prefix_chars: int = default("log_prefix_chars")
    # The ephemeral system prompt and the prefill: sent on every call, never saved (nor printed).
    ephemeral_system_prompt: str | None = field(default=None, repr=False)
    prefill: list[dict] = field(default_factory=list, repr=False)
    seed: int = 0  # the run seed: --seed, else picked at random by the run's first invocation and kept
    require_reasoning: bool = True
    mock: bool = False  # --model=mock: start the scripted server
    executor: str = default("executor")  # "pool" (local processes) or "ray"
    ray_address: str | None = None  # None: a private local Ray instance
    ray_shared_fs: bool = False  # Ray tasks write batch files themselves (the run folder is on every node)
    settings: dict = field(default_factory=dict, repr=False)  # what the run folder's run.json remembers
    n_samples: int = default("n_samples")  # samples (independent sessions) per dataset entry
    verify: VerifySettings = field(default_factory=VerifySettings)
    judge: JudgeEndpoint = field(default_factory=JudgeEndpoint)  # where a judge is asked (--judge_model, ...)
    keep: str = default("keep")  # what the merge writes: all samples, passed ones, or the best one per entry
    stop_after_passes: int | None = None  # an entry's remaining samples are not started after this many passes
    exports: tuple[str, ...] = ()  # --export: formats written under export/ at every merge
    report: bool = default("report")  # report.html at every merge
    report_max_trajectories: int = default("report_max_trajectories")  # trajectories the report's browser embeds
    summary_json: bool = False  # the final summary also as one JSON object on stdout, the console on stderr
    money: MoneySettings = field(default_factory=MoneySettings)  # cache, budget, per-prompt and rate limits
    setup_timeout: float = default(
        "setup_timeout"
    )  # seconds for a task's `setup` (and, with --check_tasks, its `solution`)
    rescore: bool = False  # verify the finished samples again (run/rescore.py); no call to the agent's model
    check_tasks: bool = False  # check every task (oracle passes, a no-op fails) instead of running the model
    changes: tuple[str, ...] = ()  # may-change settings this resume changed: "--max_cost: 1.00 -> 2.00"
    max_attempts: int = default("max_attempts")  # tries of a sample over every invocation (runfolder/attempts.py)
    given: frozenset[str] = frozenset()  # the flags given on the command line (they win over a task.toml)
    retry_failed: tuple[str, ...] = ()  # failure classes a resume sends again although it would not (failures.py)
    mcp_servers: tuple[Server, ...] = ()  # --mcp_config's
    mcp_listing: dict[str, list[dict]] = field(default_factory=dict)  # what each offers, listed at the run's start
    plugins: tuple[Plugin, ...] = ()  # --plugins and --tools, loaded: a Ray worker loads them again (plugins.py)

    @property
    def own_toolsets(self) -> tuple[str, ...]:
        """The toolsets of --tools and --mcp_config: offered to every sample, besides the distribution's draw."""
        files = [plugin.toolset for plugin in self.plugins if plugin.flag == "tools"]
        return (*files, *(server.name for server in self.mcp_servers))

    @property
    def preamble(self) -> list[dict]:
        """What every model call starts with: the ephemeral system prompt, then the prefill."""
        system = [{"role": "system", "content": self.ephemeral_system_prompt}]
        return (system if self.ephemeral_system_prompt is not None else []) + self.prefill

    @property
    def secrets(self) -> Secrets:
        search = self.tools.search
        keys = [None if self.model.api_key == NO_KEY else self.model.api_key, search.api_key if search else None]
        keys.append(self.judge.api_key)
        # An MCP server's env and headers hold its keys: what it echoes of them is masked like the run's own.
        keys += [value for server in self.mcp_servers for value in (*server.env.values(), *server.headers.values())]
        return Secrets(keys, self.ephemeral_system_prompt, [message["content"] for message in self.prefill])
