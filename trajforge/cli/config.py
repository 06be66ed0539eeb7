"""Command-line flags -> one RunConfig, checked once before anything runs."""

from __future__ import annotations

import importlib.util
import json
import math
import operator
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from toolset_distributions import DISTRIBUTIONS
from trajforge.cli.flagtable import FLAGS, MAY_CHANGE, OPENROUTER, default
from trajforge.cli.remembered import Remembered, changes, digest, itself, remembered, settle_flags
from trajforge.environments import KINDS, EnvironmentSettings
from trajforge.environments.limits import Limits
from trajforge.errors import UsageError
from trajforge.export import FORMATS
from trajforge.failures import RETRYABLE
from trajforge.model.settings import ModelSettings
from trajforge.model.tokens import token_mode
from trajforge.money.pricing import Prices
from trajforge.money.spending import MoneySettings
from trajforge.runfolder.folder import RunFolder
from trajforge.secrets import Secrets
from trajforge.tools.settings import ToolSettings
from trajforge.verification.result import VerifySettings

PROVIDER_SORTS = ("price", "throughput", "latency")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
NO_KEY = "not-needed"  # what we send to a local server when the user gave no key: no secret
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
KEEP = ("all", "passed", "best")


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
    resume: bool = False
    verbose: bool = False
    max_samples: int | None = None
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
    keep: str = default("keep")  # what the merge writes: all samples, passed ones, or the best one per entry
    stop_after_passes: int | None = None  # an entry's remaining samples are not started after this many passes
    exports: tuple[str, ...] = ()  # --export: formats written under export/ at every merge
    report: bool = default("report")  # report.html at every merge
    report_max_trajectories: int = default("report_max_trajectories")  # trajectories the report's browser embeds
    money: MoneySettings = field(default_factory=MoneySettings)  # cache, budget, per-prompt and rate limits
    setup_timeout: float = default(
        "setup_timeout"
    )  # seconds for a task's `setup` (and, with --check_tasks, its `solution`)
    check_tasks: bool = False  # check every task (oracle passes, a no-op fails) instead of running the model
    changes: tuple[str, ...] = ()  # may-change settings this resume changed: "--max_cost: 1.00 -> 2.00"
    max_attempts: int = default("max_attempts")  # tries of a sample over every invocation (runfolder/attempts.py)
    retry_failed: tuple[str, ...] = ()  # failure classes a resume sends again although it would not (failures.py)

    @property
    def preamble(self) -> list[dict]:
        """What every model call starts with: the ephemeral system prompt, then the prefill."""
        system = [{"role": "system", "content": self.ephemeral_system_prompt}]
        return (system if self.ephemeral_system_prompt is not None else []) + self.prefill

    @property
    def secrets(self) -> Secrets:
        search = self.tools.search
        keys = [None if self.model.api_key == NO_KEY else self.model.api_key, search and search.api_key]
        return Secrets(keys, self.ephemeral_system_prompt, [message["content"] for message in self.prefill])


def as_list(value, flag: str) -> list[str]:
    """Fire hands `a,b` over as a tuple, `a` as a str: accept either (and lists)."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    out = [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    if not out:
        raise UsageError(f"--{flag} needs at least one name (comma separated)")
    return out


def as_bool(value, flag: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE or text in FALSE:
        return text in TRUE
    raise UsageError(f"--{flag} must be true or false, got {value!r}")


def as_int(value, flag: str, minimum: int, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if value is None:
        raise UsageError(f"--{flag} is required")
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().lstrip("-").isdigit():
        raise UsageError(f"--{flag} must be a whole number, got {value!r}")
    number = int(value)
    if number < minimum:
        raise UsageError(f"--{flag} must be at least {minimum}, got {number}")
    return number


def as_seconds(value, flag: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):  # a bare --flag comes as True
        raise UsageError(f"--{flag} must be a number of seconds, got {value!r}")
    if number <= 0:
        raise UsageError(f"--{flag} must be more than 0 seconds")
    return number


def as_number(value, flag: str, what: str = "a number") -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise UsageError(f"--{flag} must be {what}, got {value!r}")
    return number


LIMIT_FLAGS = ("max_processes", "max_memory_mb", "max_file_size_mb")  # Limits' fields, in order; 0 for none


def as_range(value, flag: str) -> tuple[float, float]:
    """LOW,HIGH (Fire hands a comma-separated value over as a tuple; run.json keeps a list)."""
    parts = value.split(",") if isinstance(value, str) else value
    form = UsageError(f"--{flag} must be LOW,HIGH (two numbers, LOW <= HIGH), got {value!r}")
    if not isinstance(parts, list | tuple) or len(parts) != 2:
        raise form
    low, high = (as_number(part, flag, "LOW,HIGH (two numbers)") for part in parts)
    if low > high:
        raise form
    return low, high


def as_amount(value, flag: str, what: str = "an amount in USD", positive: bool = True) -> float | None:
    """A finite number (more than 0, or at least 0 for a price), or None when the flag was not given."""
    if value is None:
        return None
    number = as_number(value, flag, what)
    if number < 0 or (positive and number == 0):
        raise UsageError(f"--{flag} must be {'more than' if positive else 'at least'} 0, got {value!r}")
    return number


def _verifier(value) -> str | None:
    """The --verifier spec, its file made absolute, after loading it once: a missing file or function
    stops the run here, before any request."""
    spec = _verifier_spec(value, "verifier")
    if spec is not None:
        from trajforge.verification.python_verifier import load_verifier

        load_verifier(spec)
    return spec


def _prices(flags: dict) -> Prices | None:
    """USD per million tokens; input and output go together (half a price would be a wrong cost)."""
    per_million = "a price in USD per million tokens"
    found = {f: as_amount(flags[f], f, per_million, positive=False) for f in ("price_input", "price_output")}
    cached = as_amount(flags["price_cached_input"], "price_cached_input", per_million, positive=False)
    if None in found.values():
        if any(value is not None for value in (*found.values(), cached)):
            raise UsageError("--price_input and --price_output go together (USD per million tokens); pass both")
        return None
    return Prices(found["price_input"], found["price_output"], cached)


def _money(flags: dict, run_dir: Path, max_retries: int, request_timeout: float) -> MoneySettings:
    money = MoneySettings(
        folder=str(run_dir.resolve()),
        host=socket.gethostname(),
        max_cost=as_amount(flags["max_cost"], "max_cost"),
        max_cost_per_prompt=as_amount(flags["max_cost_per_prompt"], "max_cost_per_prompt"),
        max_tokens_per_prompt=as_int(flags["max_tokens_per_prompt"], "max_tokens_per_prompt", 1, optional=True),
        max_requests_per_minute=as_amount(flags["max_requests_per_minute"], "max_requests_per_minute", "a number"),
        max_tokens_per_minute=as_amount(flags["max_tokens_per_minute"], "max_tokens_per_minute", "a number"),
        cache=not as_bool(flags["no_cache"], "no_cache"),
        # No call can hold its reservation longer than all its attempts and the waits between them.
        reservation_ttl=request_timeout * (max_retries + 1) + 60.0 * max_retries + 60.0,
    )
    shared = money.max_cost or money.max_requests_per_minute or money.max_tokens_per_minute
    if shared and flags["executor"] == "ray" and flags["ray_address"] is not None:
        raise UsageError(
            "--max_cost and the rate limits hold for the processes of the machine that starts the run (they share "
            "a database in the run folder); with --ray_address, tasks on other nodes would not count. Leave "
            "--ray_address out (a local Ray instance) or use --executor=pool"
        )
    return money


def _verifier_spec(value, flag: str) -> str | None:
    """The spec with its file made absolute (what run.json keeps: a resume may run from elsewhere)."""
    if value is None:
        return None
    if isinstance(value, bool) or not str(value).strip():
        raise UsageError(f"--{flag} needs path/to/file.py:function or module:function")
    from trajforge.verification.python_verifier import normalize

    return normalize(str(value))


def choice(value, flag: str, allowed) -> str | None:
    if value is None:
        return None
    if str(value) not in allowed:
        raise UsageError(f"--{flag} must be one of {', '.join(allowed)}; got {value!r}")
    return str(value)


def load_prefill(path) -> list[dict]:
    if path is None:
        return []
    try:
        messages = json.loads(Path(str(path)).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--prefill_messages_file: {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prefill_messages_file: {path} is not valid JSON ({exc})") from None
    if not isinstance(messages, list):
        raise UsageError(f"--prefill_messages_file: {path} must hold a JSON list of {{role, content}} objects")
    for number, message in enumerate(messages, 1):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("system", "user", "assistant")
            or not isinstance(message.get("content"), str)
        ):
            raise UsageError(
                f"--prefill_messages_file: {path} message {number} needs a role (system, user or assistant) "
                "and a string content"
            )
    return messages


def _url(value, flag: str) -> str:
    return str(value).rstrip("/")


def _number(minimum: int, optional: bool = False) -> Callable:
    return lambda value, flag: as_int(value, flag, minimum, optional)


def _names(value, flag: str) -> list[str] | None:
    return as_list(value, flag) or None


def _one_of(allowed) -> Callable:
    return lambda value, flag: choice(value, flag, allowed)


def _image(value, flag: str) -> str:
    image = str(value).strip()
    if not image:
        raise UsageError(f"--{flag} must name an image, such as python:3.11-slim")
    return image


def _secret(value, flag: str) -> str | None:
    return None if value is None else digest(str(value))


def _secret_back(kept, flag: str):
    if kept is not None:  # only its digest was kept: the text itself must come again
        raise UsageError(f"--{flag}: this run was made with one ({kept}), which is never saved; pass the same again")
    return None


def _prefill_file(value, flag: str) -> dict | None:
    if value is None:
        return None
    return {"path": str(Path(str(value)).resolve()), "sha256": digest(load_prefill(value))}


def _prefill_back(kept, flag: str) -> str | None:
    return None if kept is None else kept["path"]


def _same_prefill(kept, now) -> bool:
    """The same messages from another path are the same run."""
    return (kept and kept["sha256"]) == (now and now["sha256"])


def _amount(positive: bool = True) -> Callable:
    return lambda value, flag: as_amount(value, flag, positive=positive)


# The checks of the flags run.json keeps (flagtable: remembered or may change) whose value is more than
# text: (normal, restore, agrees) as remembered.Remembered takes them.
CHECKS: dict[str, tuple] = {
    "base_url": (_url,),
    "distribution": (_one_of(tuple(DISTRIBUTIONS)),),
    "max_turns": (_number(1),),
    "max_tokens": (_number(1, optional=True),),
    "max_tool_calls_per_turn": (_number(1),),
    "providers_allowed": (_names,),
    "providers_ignored": (_names,),
    "providers_order": (_names,),
    "provider_sort": (_one_of(PROVIDER_SORTS),),
    "reasoning_effort": (_one_of(REASONING_EFFORTS),),
    "reasoning_disabled": (as_bool,),
    "ephemeral_system_prompt": (_secret, _secret_back),
    "prefill_messages_file": (_prefill_file, _prefill_back, _same_prefill),
    "environment": (_one_of(KINDS),),
    "default_image": (_image,),
    "sandbox_network": (as_bool,),
    "allow_private_urls": (as_bool,),
    "seed": (_number(0, optional=True),),  # None: the first invocation picks one (build_config)
    # Samples per entry may grow on a resume (only the new sample indices run).
    "n_samples": (_number(1), itself, operator.le),
    "verify_timeout": (as_seconds,),
    "pass_threshold": (as_number,),
    "reward_range": (lambda value, flag: list(as_range(value, flag)),),
    "verifier": (_verifier_spec,),
    "keep": (_one_of(KEEP),),
    "batch_size": (_number(1, optional=True),),
    "num_workers": (_number(1),),
    "concurrency": (_number(1),),
    "max_attempts": (_number(1),),
    "stop_after_passes": (_number(1, optional=True),),
    "price_input": (_amount(positive=False),),
    "price_output": (_amount(positive=False),),
    "price_cached_input": (_amount(positive=False),),
    "max_cost": (_amount(),),
    "max_cost_per_prompt": (_amount(),),
    "max_tokens_per_prompt": (_number(1, optional=True),),
    # Token ids shape the data (tokens.jsonl, the cache keys); on and required differ only in what a
    # reply without them does, so a resume may switch between those two.
    "token_ids": (token_mode, itself, lambda kept, now: (kept == "off") == (now == "off")),
}
RUN_SETTINGS: tuple[Remembered, ...] = tuple(
    Remembered(flag.name, flag.default, *CHECKS.get(flag.name, ()), may_change=flag.resume == MAY_CHANGE)
    for flag in FLAGS
    if flag.kept
)
# Before any prompt of a run has finished, nothing was made with these: a resume may still change them.
UNTIL_FIRST_PROMPT = ("model", "base_url")


def settle(flags: dict, kept: dict | None = None, where: Path | None = None, fresh: bool = False) -> dict:
    """The flags with RUN_SETTINGS settled against run.json (`kept`) or their defaults. `fresh`: no
    prompt of the run has finished, so --model and --base_url may still change."""
    rows = RUN_SETTINGS
    if fresh and kept:
        rows = tuple(replace(row, may_change=True) if row.flag in UNTIL_FIRST_PROMPT else row for row in rows)
        if kept.get("vision_model") == kept.get("model"):  # it was the main model: it follows a new --model
            kept = {name: value for name, value in kept.items() if name != "vision_model"}
    flags = settle_flags(rows, flags, kept, where)
    if flags["vision_model"] is None:
        flags["vision_model"] = flags["model"]
    return flags


def _extra_body(flags: dict) -> dict:
    """OpenRouter request options, sent to any base_url when the user gave the flag."""
    provider = {}
    for flag, key in (("providers_allowed", "only"), ("providers_ignored", "ignore"), ("providers_order", "order")):
        if flags[flag] is not None:
            provider[key] = as_list(flags[flag], flag)
    sort = choice(flags["provider_sort"], "provider_sort", PROVIDER_SORTS)
    if sort:
        provider["sort"] = sort
    body: dict = {"provider": provider} if provider else {}
    effort = choice(flags["reasoning_effort"], "reasoning_effort", REASONING_EFFORTS)
    if as_bool(flags["reasoning_disabled"], "reasoning_disabled"):
        if effort:
            raise UsageError("--reasoning_disabled and --reasoning_effort contradict each other; pass one")
        body["reasoning"] = {"enabled": False}
    elif effort:
        body["reasoning"] = {"effort": effort}
    return body


def _api_key(flags: dict, base_url: str, mock: bool) -> str:
    if flags["api_key"] is not None:
        return str(flags["api_key"])
    key = os.environ.get("OPENROUTER_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if key:
        return key
    if mock:
        return "mock"
    if base_url.rstrip("/") == OPENROUTER:
        raise UsageError("no API key: pass --api_key or set OPENROUTER_API_KEY (or OPENAI_API_KEY)")
    return NO_KEY  # local servers (vLLM, llama.cpp) usually accept any key


def _retried(flags: dict) -> list[str]:
    return as_list(flags["retry_failed"], "retry_failed")


def export_formats(value) -> tuple[str, ...]:
    if value is None:
        return ()
    names = as_list(value, "export")
    unknown = [name for name in names if name not in FORMATS]
    if unknown:
        raise UsageError(f"--export: unknown format {unknown[0]!r}; choose from {', '.join(FORMATS)} (comma separated)")
    return tuple(dict.fromkeys(names))


def tool_settings(flags: dict) -> ToolSettings:
    """--vision_model defaults to the main model; search provider and browser come from the environment."""
    vision_model = flags["vision_model"] if flags["vision_model"] is not None else flags["model"]
    allow_private = as_bool(flags["allow_private_urls"], "allow_private_urls")
    return ToolSettings.from_environment(str(vision_model), str(flags["image_model"]), allow_private)


def _executor(flags: dict) -> str:
    executor = choice(flags["executor"], "executor", ("pool", "ray"))
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise UsageError("--executor=ray needs Ray, which is not installed: pip install -e '.[ray]'")
    return executor


def _opened(flags: dict) -> tuple[dict, dict | None, Path]:
    """The flags settled against the run folder's run.json (on --resume), what run.json held, and
    the run folder; UsageError for a missing required flag or a run name that is no folder name."""
    for flag in ("dataset_file", "run_name"):
        if flags[flag] is None:
            raise UsageError(f"--{flag} is required (see --help)")
    run_name = str(flags["run_name"])
    if not run_name.strip() or "/" in run_name or run_name in (".", ".."):
        raise UsageError(f"--run_name must be a plain folder name, got {run_name!r}")
    run_dir = Path(str(flags["output_dir"])) / run_name
    folder = RunFolder(run_dir)
    kept = folder.load_settings() if as_bool(flags["resume"], "resume") else None
    fresh = kept is not None and next(iter(folder.batch_lines(lambda _: None)), None) is None
    flags = settle(flags, kept, folder.settings, fresh)
    if flags["batch_size"] is None:
        raise UsageError("--batch_size is required (see --help)")
    if flags["seed"] is None:  # the run seed: drawn once, then kept in run.json like a given one
        flags["seed"] = random.SystemRandom().randrange(2**31)
    if str(flags["distribution"]) not in DISTRIBUTIONS:
        raise UsageError(
            f"--distribution {flags['distribution']!r} does not exist; choose one of: {', '.join(DISTRIBUTIONS)}"
        )
    return flags, kept, run_dir


def _model(flags: dict) -> ModelSettings:
    model_name, base_url = str(flags["model"]), str(flags["base_url"])
    return ModelSettings(
        model=model_name,
        base_url=base_url,
        # A task check calls no model, so it needs no key.
        api_key=_api_key(flags, base_url, model_name == "mock" or as_bool(flags["check_tasks"], "check_tasks")),
        max_tokens=as_int(flags["max_tokens"], "max_tokens", 1, optional=True),
        extra_body=_extra_body(flags),
        request_timeout=as_seconds(flags["request_timeout"], "request_timeout"),
        max_retries=as_int(flags["max_retries"], "max_retries", 0),
        stream=as_bool(flags["stream"], "stream"),
        prices=_prices(flags),
        token_ids=token_mode(flags["token_ids"]),
    )


def _environment(flags: dict, run_dir: Path) -> EnvironmentSettings:
    return EnvironmentSettings(
        kind=choice(flags["environment"], "environment", KINDS),
        command_timeout=as_seconds(flags["command_timeout"], "command_timeout"),
        keep_workspaces=as_bool(flags["keep_workspaces"], "keep_workspaces"),
        default_image=_image(flags["default_image"], "default_image"),
        sandbox_network=as_bool(flags["sandbox_network"], "sandbox_network"),
        limits=Limits(*(as_int(flags[name], name, 0) for name in LIMIT_FLAGS)),
        run_name=run_dir.name,
        run_dir=str(run_dir.resolve()),  # labels this run's containers, whatever the cwd of a later --resume
    )


def build_config(flags: dict) -> RunConfig:
    """Check every flag; raise UsageError naming the first bad one."""
    flags, kept, run_dir = _opened(flags)
    model = _model(flags)
    exports = export_formats(flags["export"])
    if "rl" in exports and model.token_ids == "off":
        raise UsageError("--export=rl builds its rows from token ids: add --token_ids (a new run, or one made with it)")
    require, ephemeral = flags["require_reasoning"], flags["ephemeral_system_prompt"]
    if model.token_ids != "off" and (ephemeral is not None or flags["prefill_messages_file"] is not None):
        # The prompt's ids hold what the model saw, the never-saved system prompt and prefill included.
        raise UsageError(
            "--token_ids saves the prompt's token ids, which would hold the --ephemeral_system_prompt and "
            "--prefill_messages_file that are never saved: leave those out of a run with --token_ids"
        )
    return RunConfig(
        dataset_file=Path(str(flags["dataset_file"])),
        batch_size=as_int(flags["batch_size"], "batch_size", 1),
        run_name=run_dir.name,
        run_dir=run_dir,
        distribution=str(flags["distribution"]),
        model=model,
        environment=_environment(flags, run_dir),
        tools=tool_settings(flags),
        max_turns=as_int(flags["max_turns"], "max_turns", 1),
        max_tool_calls_per_turn=as_int(flags["max_tool_calls_per_turn"], "max_tool_calls_per_turn", 1),
        prompt_timeout=as_seconds(flags["prompt_timeout"], "prompt_timeout"),
        num_workers=as_int(flags["num_workers"], "num_workers", 1),
        concurrency=as_int(flags["concurrency"], "concurrency", 1),
        resume=as_bool(flags["resume"], "resume"),
        verbose=as_bool(flags["verbose"], "verbose"),
        max_samples=as_int(flags["max_samples"], "max_samples", 1, optional=True),
        log_prefix_chars=as_int(flags["log_prefix_chars"], "log_prefix_chars", 0),
        ephemeral_system_prompt=None if ephemeral is None else str(ephemeral),
        prefill=load_prefill(flags["prefill_messages_file"]),
        seed=as_int(flags["seed"], "seed", 0),
        # Without reasoning from the model, the no-reasoning filter would drop every sample.
        require_reasoning=(
            not as_bool(flags["reasoning_disabled"], "reasoning_disabled")
            if require is None
            else as_bool(require, "require_reasoning")
        ),
        mock=model.model == "mock",
        executor=_executor(flags),
        ray_address=None if flags["ray_address"] is None else str(flags["ray_address"]),
        ray_shared_fs=as_bool(flags["ray_shared_fs"], "ray_shared_fs"),
        settings=(kept or {}) | remembered(RUN_SETTINGS, flags),  # what run.json lacks is kept from now on
        n_samples=as_int(flags["n_samples"], "n_samples", 1),
        verify=VerifySettings(
            timeout=as_seconds(flags["verify_timeout"], "verify_timeout"),
            threshold=as_number(flags["pass_threshold"], "pass_threshold"),
            reward_range=as_range(flags["reward_range"], "reward_range"),
            verifier=_verifier(flags["verifier"]),
        ),
        keep=choice(flags["keep"], "keep", KEEP),
        stop_after_passes=as_int(flags["stop_after_passes"], "stop_after_passes", 1, optional=True),
        exports=exports,
        report=as_bool(flags["report"], "report"),
        report_max_trajectories=as_int(flags["report_max_trajectories"], "report_max_trajectories", 0),
        money=_money(flags, run_dir, model.max_retries, model.request_timeout),
        setup_timeout=as_seconds(flags["setup_timeout"], "setup_timeout"),
        check_tasks=as_bool(flags["check_tasks"], "check_tasks"),
        changes=tuple(changes(RUN_SETTINGS, flags, kept)),
        max_attempts=as_int(flags["max_attempts"], "max_attempts", 1),
        retry_failed=tuple(choice(name, "retry_failed", RETRYABLE) for name in _retried(flags)),
    )
