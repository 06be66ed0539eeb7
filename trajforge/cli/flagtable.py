"""Every command-line flag, once: its type, default, one line of help, --help group and resume rule.

`main`'s signature (what Fire binds), config's defaults, run.json's memory (config.RUN_SETTINGS),
--help and docs/flags.md all come from FLAGS. Adding a flag is one Flag(...) entry here (plus reading
it where it takes effect, and for a remembered flag that is not plain text, its check in
config.CHECKS). No imports of the package: any module may read a default from here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

REMEMBERED = "remembered"  # run.json keeps it; a --resume without it goes on with it, with another refuses
MAY_CHANGE = "may change"  # run.json keeps it as a resume's default; a flag changes it (said once) from then on
PER_INVOCATION = "per invocation"  # never kept: each invocation's own flag or default

GROUPS = ("required", "model and endpoint", "run", "sandbox", "samples and verification", "money", "output")
OPENROUTER = "https://openrouter.ai/api/v1"


@dataclass(frozen=True)
class Flag:
    name: str
    type: type
    default: object
    help: str
    group: str
    resume: str = PER_INVOCATION
    shown: str | None = None  # the default as people read it, where the value (None) means something else

    @property
    def kept(self) -> bool:
        """run.json keeps it (remembered or may change)."""
        return self.resume != PER_INVOCATION

    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.default is None:
            return "none"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


_R, _M = REMEMBERED, MAY_CHANGE
REQ, MOD, RUN, BOX, VER, USD, OUT = GROUPS

FLAGS: tuple[Flag, ...] = (
    Flag("dataset_file", str, None, "the JSONL dataset, one entry a line", REQ, shown="required"),
    Flag(
        "batch_size", int, None, "entries per batch file batch_N.jsonl", REQ, _M, shown="required (a resume: the run's)"
    ),
    Flag("run_name", str, None, "the run folder's name, <output_dir>/<run_name>", REQ, shown="required"),
    Flag(
        "model", str, "anthropic/claude-sonnet-4.6", "the model to call (mock: the scripted one, started here)", MOD, _R
    ),
    Flag("base_url", str, OPENROUTER, "the OpenAI-compatible endpoint", MOD, _R),
    Flag("api_key", str, None, "the endpoint's key (never saved)", MOD, shown="$OPENROUTER_API_KEY or $OPENAI_API_KEY"),
    Flag("max_tokens", int, None, "completion tokens per model call", MOD, _R, shown="the server's"),
    Flag("providers_allowed", str, None, "OpenRouter: only these providers (comma separated)", MOD, _R),
    Flag("providers_ignored", str, None, "OpenRouter: never these providers", MOD, _R),
    Flag("providers_order", str, None, "OpenRouter: try providers in this order", MOD, _R),
    Flag("provider_sort", str, None, "OpenRouter: price, throughput or latency", MOD, _R),
    Flag("reasoning_effort", str, None, "none, minimal, low, medium, high or xhigh", MOD, _R),
    Flag("reasoning_disabled", bool, False, "ask the model not to reason", MOD, _R),
    Flag(
        "require_reasoning",
        bool,
        None,
        "drop samples without reasoning",
        MOD,
        shown="true (false if reasoning_disabled)",
    ),
    Flag("request_timeout", float, 600.0, "seconds for one model request, streams included", MOD),
    Flag("max_retries", int, 6, "retries of a model call (429, 5xx, timeouts)", MOD),
    Flag("stream", bool, False, "stream the model's replies", MOD),
    Flag(
        "token_ids",
        str,
        "off",
        "keep token ids and logprobs (on, or required: exit 2 on a reply without); tokens.jsonl",
        MOD,
        _R,
    ),
    Flag("vision_model", str, None, "the model behind vision_analyze", MOD, _R, shown="--model"),
    Flag("image_model", str, "gpt-image-1", "the model behind image_generate", MOD, _R),
    Flag("distribution", str, "default", "the toolset distribution (--list_distributions)", RUN, _R),
    Flag("list_distributions", bool, False, "print the toolset distributions and exit", RUN),
    Flag("max_turns", int, 10, "model calls per session; then the sample is partial", RUN, _R),
    Flag("max_tool_calls_per_turn", int, 32, "tool calls of one reply that run", RUN, _R),
    Flag("prompt_timeout", float, 3600.0, "seconds for a whole session; then partial", RUN),
    Flag("num_workers", int, 4, "worker processes", RUN, _M),
    Flag("concurrency", int, 1, "sessions at once in each worker", RUN, _M),
    Flag("resume", bool, False, "go on with the run in <output_dir>/<run_name>", RUN),
    Flag("max_attempts", int, 3, "tries of one sample over every invocation; then it is exhausted (exit 4)", RUN, _M),
    Flag("retry_failed", str, None, "endpoint: a resume sends again what the endpoint refused (400 ...)", RUN),
    Flag("max_samples", int, None, "only the first N entries of the dataset", RUN, shown="all"),
    Flag("seed", int, None, "the run seed (toolset draws)", RUN, _R, shown="drawn once, then kept"),
    Flag("ephemeral_system_prompt", str, None, "a system prompt sent, never saved", RUN, _R),
    Flag("prefill_messages_file", str, None, "a JSON list of messages sent first, never saved", RUN, _R),
    Flag("executor", str, "pool", "pool (local processes) or ray", RUN),
    Flag("ray_address", str, None, "a Ray cluster to join", RUN, shown="a private local Ray"),
    Flag("ray_shared_fs", bool, False, "Ray tasks write batch files themselves (shared run folder)", RUN),
    Flag("verbose", bool, False, "log each step of every session", RUN),
    Flag("log_prefix_chars", int, 100, "characters of a step shown by --verbose", RUN),
    Flag("environment", str, "auto", "where tools run: auto, bwrap, docker, local, ...", BOX, _R),
    Flag("default_image", str, "python:3.11-slim", "the container image of entries without one", BOX, _R),
    Flag("command_timeout", float, 180.0, "seconds for one terminal command", BOX),
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
    Flag("allow_private_urls", bool, False, "let web tools fetch loopback and private addresses", BOX, _R),
    Flag("n_samples", int, 1, "samples (sessions) per entry; may grow on --resume", VER, _R),
    Flag("verifier", str, None, "path/to/file.py:function or module:function that scores a sample", VER, _R),
    Flag("verify_timeout", float, 300.0, "seconds for one sample's verification", VER, _R),
    Flag("setup_timeout", float, 600.0, "seconds for a task's setup (and its solution with --check_tasks)", VER, _M),
    Flag("check_tasks", bool, False, "check every task (oracle passes, no-op fails); no model call", VER),
    Flag("pass_threshold", float, 0.5, "reward at which a sample passes", VER, _R),
    Flag("reward_range", str, "0,1", "LOW,HIGH: a reward outside it is a verification error", VER, _R),
    Flag("keep", str, "all", "what trajectories.jsonl keeps: all, passed or best", VER, _M),
    Flag("stop_after_passes", int, None, "start no more samples of an entry after N passes", VER, _M, shown="never"),
    Flag("price_input", float, None, "USD per million input tokens", USD, _M, shown="the endpoint's cost"),
    Flag("price_output", float, None, "USD per million output tokens", USD, _M, shown="the endpoint's cost"),
    Flag("price_cached_input", float, None, "USD per million cached input tokens", USD, _M, shown="price_input"),
    Flag("max_cost", float, None, "USD for the whole run; then exit 3", USD, _M, shown="no limit"),
    Flag("max_cost_per_prompt", float, None, "USD for one session; then partial", USD, _M, shown="no limit"),
    Flag("max_tokens_per_prompt", int, None, "tokens for one session; then partial", USD, _M, shown="no limit"),
    Flag("max_requests_per_minute", float, None, "model requests per minute", USD, shown="no limit"),
    Flag("max_tokens_per_minute", float, None, "tokens per minute", USD, shown="no limit"),
    Flag("no_cache", bool, False, "do not answer calls from the response cache", USD),
    Flag("output_dir", str, "data", "where run folders are made", OUT),
    Flag("export", str, None, "also write these formats under export/ (comma separated)", OUT),
    Flag("report", bool, True, "write report.html", OUT),
    Flag("report_max_trajectories", int, 2000, "trajectories report.html embeds", OUT),
)
BY_NAME = {flag.name: flag for flag in FLAGS}


def default(name: str):
    """The one default of --`name`."""
    return BY_NAME[name].default


def signature() -> inspect.Signature:
    """`main`'s keyword-only parameters, for Fire. A flag run.json keeps is None when not given, so
    that --resume can tell it apart (config settles it); the others carry their default."""
    parameters = [
        inspect.Parameter(
            flag.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=None if flag.kept else flag.default,
            annotation=flag.type if flag.default is not None and not flag.kept else flag.type | None,
        )
        for flag in FLAGS
    ]
    return inspect.Signature(parameters, return_annotation=None)


def given(flags: dict) -> dict:
    """Every flag: those given, and the signature's defaults for the others (Fire passes only the
    keyword-only flags it was given)."""
    return {name: parameter.default for name, parameter in signature().parameters.items()} | flags


def _placeholder(flag: Flag) -> str:
    return "" if flag.type is bool else "=" + {int: "N", float: "X"}.get(flag.type, "TEXT")


def help_text(version: str) -> str:
    """--help: the flags by group, one line each with its default."""
    lines = [
        f"batch_runner {version}: run a tool-using agent over every prompt of a JSONL dataset",
        "usage: python batch_runner.py --dataset_file=FILE --batch_size=N --run_name=NAME [--flag=value ...]",
        "       python batch_runner.py --help | --version | --list_distributions",
        "Booleans: --flag or --noflag. [kept]: run.json keeps it for --resume (docs/flags.md: resume rules).",
    ]
    for group in GROUPS:
        lines += ["", f"{group}:"]
        for flag in (flag for flag in FLAGS if flag.group == group):
            left = f"  --{flag.name}{_placeholder(flag)}"
            said = flag.default_text()
            said = said if said.startswith("required") else f"default {said}"
            lines.append(f"{left:<31} {flag.help}; {said}" + (" [kept]" if flag.kept else ""))
    return "\n".join(lines) + "\n"


REFERENCE_INTRO = """\
# Flags

Generated from `trajforge/cli/flagtable.py` by `python -m trajforge.cli.flagtable > docs/flags.md`; a test
checks that this file is what the table gives. `python batch_runner.py --help` prints the same flags.

Flags are written `--name=value` (or `--name value`); a boolean is `--name` or `--noname`. A misspelt
flag stops the run with exit 2, naming the closest one.

**Numbering.** Dataset entries are numbered from 0 everywhere the runner names them: `prompt_index` in
the records, `errors.jsonl` and the checkpoint, and `prompt N` in messages (its position among the
dataset's non-blank lines). Only the dataset check, which points into the file, names a file line,
counted from 1 as editors do (`line 51`).

**Output.** Results (the summary, output paths, the command that continues a run) go to stdout;
warnings and the progress line go to stderr, so `| head` and `> file` keep only results.

**Resume rules.** With `--resume`, each setting follows its rule:

- *remembered*: `run.json` keeps the first invocation's value; a resume without the flag goes on with
  it, and a different value is refused (exit 2). `--n_samples` may grow. While no prompt of the run
  has finished, `--model` and `--base_url` may still change.
- *may change*: `run.json` keeps the value, and a resume without the flag goes on with it; a resume
  with the flag changes it, says so once (`--max_cost: 1.00 -> 2.00`) and keeps the new value.
- *per invocation*: never kept; each invocation's own flag or default.
"""


def reference() -> str:
    """docs/flags.md: every flag by group, then the resume-rule table."""
    lines = [REFERENCE_INTRO.rstrip("\n")]
    for group in GROUPS:
        lines += ["", f"## {group.capitalize()}", "", "| flag | type | default | resume | what it does |"]
        lines.append("|---|---|---|---|---|")
        for flag in (flag for flag in FLAGS if flag.group == group):
            row = (f"`--{flag.name}`", flag.type.__name__, flag.default_text(), flag.resume, flag.help)
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    lines += ["", "## Resume rules at a glance", "", "| rule | settings |", "|---|---|"]
    for rule in (REMEMBERED, MAY_CHANGE, PER_INVOCATION):
        names = ", ".join(f"`--{flag.name}`" for flag in FLAGS if flag.resume == rule)
        lines.append(f"| {rule} | {names} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
