"""Every command-line flag, once: its type, default, one line of help, --help group, resume rule, and
how its value is read (the parser: type, bounds, choices) and compared on a resume.

`main`'s signature (what Fire binds), the settings' defaults, run.json's memory, --help and docs/flags.md
all come from FLAGS (the last two through trajforge.cli.flagtext). Adding a flag is one Flag(...) entry
here plus reading it where it takes effect (docs/internals.md: how to add a flag). Nothing here imports
the package: any module may read a default from here.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trajforge.flags import values as v
from trajforge.flags.values import Parser

REMEMBERED = "remembered"  # run.json keeps it; a --resume without it goes on with it, with another refuses
MAY_CHANGE = "may change"  # run.json keeps it as a resume's default; a flag changes it (said once) from then on
PER_INVOCATION = "per invocation"  # never kept: each invocation's own flag or default

GROUPS = ("required", "model and endpoint", "run", "sandbox", "samples and verification", "money", "output")
OPENROUTER = "https://openrouter.ai/api/v1"
MOCK = "mock"  # --model=mock: the scripted model, and --base_url's default with it (its server's port is each run's)
PROVIDER_SORTS = ("price", "throughput", "latency")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
EXECUTORS = ("pool", "ray")
KEEP = ("all", "passed", "best")
_BY_TYPE: dict[type, Parser] = {str: v.text, bool: v.boolean, float: v.number, int: v.whole(0)}


def _same(value: Any) -> Any:
    return value


def _itself(value: Any, flag: str) -> Any:
    return value


@dataclass(frozen=True)
class Flag:
    name: str
    type: type
    default: Any
    help: str
    group: str
    resume: str = PER_INVOCATION
    shown: str | None = None  # the default as people read it, where the value (None) means something else
    # (value as Fire or run.json hands it over, flag) -> the value the run uses; FlagError when it is wrong.
    # None (not given, no default) is never parsed. Unset: by type (a whole number of at least 0, ...).
    parse: Parser | None = None
    keep: Callable[[Any], Any] = _same  # the parsed value -> what run.json keeps (JSON; a secret's digest)
    restore: Callable[[Any, str], Any] = _itself  # (what run.json keeps, flag) -> the value --resume uses
    # (kept, now) -> may a resume go on with `now`? Equality unless said (a count that may grow: operator.le).
    agrees: Callable[[Any, Any], bool] = operator.eq
    repeats: bool = False  # given more than once, its values are joined (--flag=a --flag=b is --flag=a,b)

    @property
    def kept(self) -> bool:
        """run.json keeps it (remembered or may change)."""
        return self.resume != PER_INVOCATION

    @property
    def may_change(self) -> bool:
        return self.resume == MAY_CHANGE

    def read(self, value: Any) -> Any:
        """The value the run uses; FlagError naming the flag when it is wrong."""
        if value is None:
            return None
        return (self.parse or _BY_TYPE[self.type])(value, self.name)

    def normal(self, value: Any) -> Any:
        """What run.json keeps of a value (and what a resume's value is compared as)."""
        found = self.read(value)
        return None if found is None else self.keep(found)

    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.default is None:
            return "none"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


_R, _M = REMEMBERED, MAY_CHANGE
_PRICE = v.amount("a price in USD per million tokens", positive=False)
_RATE = v.amount("a number")
REQ, MOD, RUN, BOX, VER, USD, OUT = GROUPS

FLAGS: tuple[Flag, ...] = (
    Flag("dataset_file", str, None, "the JSONL dataset, one entry a line", REQ, shown="required", parse=v.path),
    Flag(
        "batch_size",
        int,
        None,
        "entries per batch file batch_N.jsonl",
        REQ,
        _M,
        shown="required (a resume: the run's)",
        parse=v.whole(1),
    ),
    Flag(
        "run_name", str, None, "the run folder's name, <output_dir>/<run_name>", REQ, shown="required", parse=v.run_name
    ),
    Flag(
        "model", str, "anthropic/claude-sonnet-4.6", "the model to call (mock: the scripted one, started here)", MOD, _R
    ),
    Flag(
        "base_url",
        str,
        OPENROUTER,
        "the OpenAI-compatible endpoint (with --model=mock: mock, the scripted model's server started here)",
        MOD,
        _R,
        keep=v.url,
    ),
    Flag("api_key", str, None, "the endpoint's key (never saved)", MOD, shown="$OPENROUTER_API_KEY or $OPENAI_API_KEY"),
    Flag("max_tokens", int, None, "completion tokens per model call", MOD, _R, shown="the server's", parse=v.whole(1)),
    Flag("providers_allowed", str, None, "OpenRouter: only these providers (comma separated)", MOD, _R, parse=v.names),
    Flag("providers_ignored", str, None, "OpenRouter: never these providers", MOD, _R, parse=v.names),
    Flag("providers_order", str, None, "OpenRouter: try providers in this order", MOD, _R, parse=v.names),
    Flag(
        "provider_sort", str, None, "OpenRouter: price, throughput or latency", MOD, _R, parse=v.one_of(PROVIDER_SORTS)
    ),
    Flag(
        "reasoning_effort",
        str,
        None,
        "none, minimal, low, medium, high or xhigh",
        MOD,
        _R,
        parse=v.one_of(REASONING_EFFORTS),
    ),
    Flag("reasoning_disabled", bool, False, "ask the model not to reason", MOD, _R),
    Flag(
        "require_reasoning",
        bool,
        None,
        "drop samples without reasoning",
        MOD,
        shown="true (false if reasoning_disabled)",
    ),
    Flag("request_timeout", float, 600.0, "seconds for one model request, streams included", MOD, parse=v.seconds),
    Flag("max_retries", int, 6, "retries of a model call (429, 5xx, timeouts)", MOD),
    Flag("stream", bool, False, "stream the model's replies", MOD),
    Flag(
        "token_ids",
        str,
        "off",
        "keep token ids and logprobs (on, or required: exit 2 on a reply without); tokens.jsonl",
        MOD,
        _R,
        parse=v.token_mode,
        agrees=v.same_token_data,
    ),
    Flag("vision_model", str, None, "the model behind vision_analyze", MOD, _R, shown="--model"),
    Flag("image_model", str, "gpt-image-1", "the model behind image_generate", MOD, _R),
    Flag(
        "distribution",
        str,
        "default",
        "the toolset distribution (--list_distributions), or a JSON file {toolset: probability}",
        RUN,
        _R,
        parse=v.registered("toolset_distributions", "names"),
    ),
    Flag("list_distributions", bool, False, "print the toolset distributions and exit", RUN),
    Flag(
        "plugins",
        str,
        None,
        "modules or .py files registering toolsets, distributions, backends, exports, verify checks (comma separated)",
        RUN,
        _R,
        parse=v.names,
    ),
    Flag(
        "tools",
        str,
        None,
        "Python files (or modules) whose public functions are tools, a toolset each (comma separated)",
        RUN,
        _R,
        parse=v.sources,
        keep=v.sources_kept("tools"),
        restore=v.sources_back,
    ),
    Flag(
        "mcp_config",
        str,
        None,
        'JSON files of MCP servers ({"mcpServers": {...}}), a toolset each (comma separated)',
        RUN,
        _R,
        parse=v.files,
        keep=v.sources_kept("mcp_config"),
        restore=v.sources_back,
    ),
    Flag("max_turns", int, 10, "model calls per session; then the sample is partial", RUN, _R, parse=v.whole(1)),
    Flag("max_tool_calls_per_turn", int, 32, "tool calls of one reply that run", RUN, _R, parse=v.whole(1)),
    Flag("prompt_timeout", float, 3600.0, "seconds for a whole session; then partial", RUN, parse=v.seconds),
    Flag("num_workers", int, 4, "worker processes", RUN, _M, parse=v.whole(1)),
    Flag("concurrency", int, 1, "sessions at once in each worker", RUN, _M, parse=v.whole(1)),
    Flag(
        "min_free_disk_mb",
        int,
        1024,
        "free MB the run folder's disk keeps: below it no new sample starts until there is more (0: never waits)",
        RUN,
    ),
    Flag(
        "adaptive_concurrency",
        bool,
        True,
        "fewer requests in flight while the endpoint answers 429/503 (at most num_workers x concurrency)",
        RUN,
    ),
    Flag("resume", bool, False, "go on with the run in <output_dir>/<run_name>", RUN),
    Flag(
        "dry_run",
        bool,
        False,
        "check the flags, dataset, tasks' files and endpoint (GET /models), print the samples and the most "
        "requests and cost they can take; send no chat request",
        RUN,
    ),
    Flag(
        "max_attempts",
        int,
        3,
        "tries of one sample over every invocation; then it is exhausted (exit 4)",
        RUN,
        _M,
        parse=v.whole(1),
    ),
    Flag(
        "retry_failed",
        str,
        None,
        "endpoint: a resume sends again what the endpoint refused (400 ...)",
        RUN,
        parse=v.names,
    ),
    Flag("max_samples", int, None, "only the first N entries of the dataset", RUN, shown="all", parse=v.whole(1)),
    Flag(
        "task_root",
        str,
        None,
        "a folder a task's workspace and tests may lie in, besides the dataset file's (repeatable)",
        RUN,
        _M,
        shown="the dataset file's folder only",
        parse=v.folders,
        keep=v.folder_names,
        repeats=True,
    ),
    Flag("seed", int, None, "the run seed (toolset draws)", RUN, _R, shown="drawn once, then kept"),
    Flag(
        "ephemeral_system_prompt",
        str,
        None,
        "a system prompt sent, never saved",
        RUN,
        _R,
        keep=v.secret_digest,
        restore=v.must_come_again,
    ),
    Flag(
        "prefill_messages_file",
        str,
        None,
        "a JSON list of messages sent first, never saved",
        RUN,
        _R,
        parse=v.prefill_path,
        keep=v.prefill_kept,
        restore=v.prefill_back,
        agrees=v.same_prefill,
    ),
    Flag("executor", str, "pool", "pool (local processes) or ray", RUN, parse=v.one_of(EXECUTORS)),
    Flag("ray_address", str, None, "a Ray cluster to join", RUN, shown="a private local Ray"),
    Flag("ray_shared_fs", bool, False, "Ray tasks write batch files themselves (shared run folder)", RUN),
    Flag("verbose", bool, False, "log each step of every session", RUN),
    Flag("log_prefix_chars", int, 100, "characters of a step shown by --verbose", RUN),
    Flag(
        "environment",
        str,
        "auto",
        "where tools run: auto, bwrap, docker, local, ...",
        BOX,
        _R,
        parse=v.registered("trajforge.environments", "kinds"),
    ),
    Flag(
        "default_image", str, "python:3.11-slim", "the container image of entries without one", BOX, _R, parse=v.image
    ),
    Flag("command_timeout", float, 180.0, "seconds for one terminal command", BOX, parse=v.seconds),
    Flag("keep_workspaces", bool, False, "leave each session's workspace on disk", BOX),
    Flag("sandbox_network", bool, False, "let sandboxed commands reach the network", BOX, _R),
    Flag("max_processes", int, 256, "processes of one sample at once (0: no limit)", BOX),
    Flag("max_memory_mb", int, 4096, "memory of one sample's processes in MB (0: no limit)", BOX),
    Flag(
        "max_file_size_mb",
        int,
        1024,
        "size of any one file a command writes, and of bwrap's /dev/shm and /tmp (0: none)",
        BOX,
    ),
    Flag(
        "max_disk_mb",
        int,
        10240,
        "disk of one sample in MB, its workspace and clean room together, with an inode per 16 KB (0: no limit)",
        BOX,
        parse=v.disk_size,
    ),
    Flag("allow_private_urls", bool, False, "let web tools fetch loopback and private addresses", BOX, _R),
    Flag(
        "n_samples",
        int,
        1,
        "samples (sessions) per entry; may grow on --resume",
        VER,
        _R,
        parse=v.whole(1),
        agrees=operator.le,
    ),
    Flag(
        "verifier",
        str,
        None,
        "path/to/file.py:function or module:function that scores a sample",
        VER,
        _R,
        parse=v.verifier_spec,
    ),
    Flag("verify_timeout", float, 300.0, "seconds for one sample's verification", VER, _R, parse=v.seconds),
    Flag(
        "setup_timeout",
        float,
        600.0,
        "seconds for a task's setup (and its solution with --check_tasks)",
        VER,
        _M,
        parse=v.seconds,
        agrees=lambda stored, now: v.seconds(stored, "setup_timeout") == now,  # 38ca73a kept it as text, "600.0"
    ),
    Flag(
        "judge",
        str,
        None,
        "a rubric file (.md, or .json with rubric, scale, judge_sees): a model judges every sample by it",
        VER,
        _R,
        parse=v.rubric_path,
        keep=v.rubric_kept,
        restore=v.rubric_back,
        agrees=v.same_rubric,
    ),
    Flag("judge_model", str, None, "the model that judges (--judge, a verify judge)", VER, _R, shown="--model"),
    Flag("judge_base_url", str, None, "the judge's endpoint", VER, _R, shown="--base_url, with its key", keep=v.url),
    Flag("judge_api_key", str, None, "the judge endpoint's key (never saved)", VER, shown="$JUDGE_API_KEY"),
    Flag("judge_samples", int, 1, "verdicts asked per sample; the reward is their mean", VER, _R, parse=v.whole(1)),
    Flag(
        "rescore",
        bool,
        False,
        "with --resume: verify every finished sample again as the dataset, --verifier and --judge say now; "
        "no call to the agent's model",
        VER,
    ),
    Flag("check_tasks", bool, False, "check every task (oracle passes, no-op fails); no model call", VER),
    Flag("pass_threshold", float, 0.5, "reward at which a sample passes", VER, _R),
    Flag(
        "reward_range",
        str,
        "0,1",
        "LOW,HIGH: a reward outside it is a verification error",
        VER,
        _R,
        parse=v.reward_range,
        keep=list,
    ),
    Flag("keep", str, "all", "what trajectories.jsonl keeps: all, passed or best", VER, _M, parse=v.one_of(KEEP)),
    Flag(
        "stop_after_passes",
        int,
        None,
        "start no more samples of an entry after N passes",
        VER,
        _M,
        shown="never",
        parse=v.whole(1),
    ),
    Flag(
        "price_input", float, None, "USD per million input tokens", USD, _M, shown="the endpoint's cost", parse=_PRICE
    ),
    Flag(
        "price_output", float, None, "USD per million output tokens", USD, _M, shown="the endpoint's cost", parse=_PRICE
    ),
    Flag(
        "price_cached_input",
        float,
        None,
        "USD per million cached input tokens",
        USD,
        _M,
        shown="price_input",
        parse=_PRICE,
    ),
    Flag(
        "judge_price_input",
        float,
        None,
        "USD per million input tokens of the judge",
        USD,
        _M,
        shown="--price_input for the same model, else the endpoint's cost",
        parse=_PRICE,
    ),
    Flag(
        "judge_price_output",
        float,
        None,
        "USD per million output tokens of the judge",
        USD,
        _M,
        shown="--price_output for the same model, else the endpoint's cost",
        parse=_PRICE,
    ),
    Flag("max_cost", float, None, "USD for the whole run; then exit 3", USD, _M, shown="no limit", parse=v.amount()),
    Flag(
        "max_cost_per_prompt",
        float,
        None,
        "USD for one session; then partial",
        USD,
        _M,
        shown="no limit",
        parse=v.amount(),
    ),
    Flag(
        "max_tokens_per_prompt",
        int,
        None,
        "tokens for one session; then partial",
        USD,
        _M,
        shown="no limit",
        parse=v.whole(1),
    ),
    Flag("max_requests_per_minute", float, None, "model requests per minute", USD, shown="no limit", parse=_RATE),
    Flag("max_tokens_per_minute", float, None, "tokens per minute", USD, shown="no limit", parse=_RATE),
    Flag("no_cache", bool, False, "do not answer calls from the response cache", USD),
    Flag("output_dir", str, "data", "where run folders are made", OUT),
    Flag("export", str, None, "also write these formats under export/ (comma separated)", OUT, parse=v.names),
    Flag("report", bool, True, "write report.html", OUT),
    Flag("report_max_trajectories", int, 2000, "trajectories report.html embeds", OUT),
    Flag(
        "summary_json",
        bool,
        False,
        "the final summary (a dry run's bounds) also as one JSON object on stdout, for jq; the rest on stderr",
        OUT,
    ),
)
BY_NAME = {flag.name: flag for flag in FLAGS}
# What --rescore may change on a resume (what verification is); run.json keeps the new values from then on.
RESCORED: tuple[str, ...] = ("verifier", "verify_timeout", "pass_threshold", "reward_range", "judge")
RESCORED += ("judge_model", "judge_base_url", "judge_samples")


def default(name: str) -> Any:
    """The one default of --`name`."""
    return BY_NAME[name].default
