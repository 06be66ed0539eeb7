"""Command-line flags -> one RunConfig, checked once before anything runs.

Each flag is read by its own parser in the flag table (trajforge/flags): type, bounds, choices. What is
written here is what lies between flags or outside the table: run.json on --resume, the key from the
environment, the names a registry holds, and the rules that tie two flags together."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from toolset_distributions import names as distributions
from trajforge import plugins, registry
from trajforge.cli.remembered import changes, remembered, settle_flags
from trajforge.environments.limits import Limits
from trajforge.environments.settings import EnvironmentSettings
from trajforge.errors import UsageError
from trajforge.failures import RETRYABLE
from trajforge.flags import BY_NAME, FLAGS, MAY_CHANGE, MOCK, OPENROUTER, RESCORED
from trajforge.flags.values import FlagError, choice, load_prefill, load_rubric
from trajforge.model.settings import NO_KEY, JudgeEndpoint, ModelSettings
from trajforge.money.pricing import Prices
from trajforge.money.spending import MoneySettings
from trajforge.runconfig import RunConfig
from trajforge.runfolder.folder import RunFolder
from trajforge.tools.mcp import servers as mcp_servers
from trajforge.tools.settings import ToolSettings
from trajforge.verification.judge import problem as judge_problem
from trajforge.verification.result import VerifySettings

RUN_SETTINGS = tuple(flag for flag in FLAGS if flag.kept)  # what run.json keeps
# Before any prompt of a run has finished, nothing was made with these: a resume may still change them.
UNTIL_FIRST_PROMPT = ("model", "base_url")
Settings = TypeVar("Settings")


def kept_rows(rescore: bool) -> tuple:
    """RUN_SETTINGS as a resume reads them; with --rescore, what verification is may change (RESCORED)."""
    if not rescore:
        return RUN_SETTINGS
    return tuple(dataclasses.replace(row, resume=MAY_CHANGE) if row.name in RESCORED else row for row in RUN_SETTINGS)


def settle(
    flags: dict, kept: dict | None = None, where: Path | None = None, fresh: bool = False, rescore: bool = False
) -> dict:
    """The flags with RUN_SETTINGS settled against run.json (`kept`) or their defaults. `fresh`: no
    prompt of the run has finished, so --model and --base_url may still change; `rescore`: what
    verification is may change (RESCORED)."""
    rows = kept_rows(rescore)
    if fresh and kept:
        rows = tuple(
            dataclasses.replace(row, resume=MAY_CHANGE) if row.name in UNTIL_FIRST_PROMPT else row for row in rows
        )
        # What followed the main model (its vision model, mock's endpoint) follows a new --model.
        followed = {"vision_model": kept.get("model"), "base_url": MOCK}
        kept = {name: value for name, value in kept.items() if followed.get(name, ...) != value}
    model = flags["model"] if flags["model"] is not None else (kept or {}).get("model", BY_NAME["model"].default)
    if model == MOCK:  # run.json names the endpoint the run had, not the public one it never reached
        rows = tuple(dataclasses.replace(row, default=MOCK) if row.name == "base_url" else row for row in rows)
    flags = settle_flags(rows, flags, kept, where)
    if flags["vision_model"] is None:
        flags["vision_model"] = flags["model"]
    return flags


def read(flags: dict) -> dict[str, Any]:
    """Every flag as the run uses it, each read by the table's parser (FlagError naming the first wrong one)."""
    return {flag.name: flag.read(flags[flag.name]) for flag in FLAGS}


def from_flags(made: type[Settings], values: dict, /, **others: Any) -> Settings:
    """A settings dataclass: its fields named as flags from `values`, the others given."""
    names = {field.name for field in dataclasses.fields(made)} & values.keys()  # type: ignore[arg-type]
    return made(**{name: values[name] for name in names - others.keys()}, **others)


def _extra_body(values: dict) -> dict:
    """OpenRouter request options, sent to any base_url when the user gave the flag."""
    provider = {}
    for flag, key in (("providers_allowed", "only"), ("providers_ignored", "ignore"), ("providers_order", "order")):
        if values[flag] is not None:
            provider[key] = values[flag]
    if values["provider_sort"]:
        provider["sort"] = values["provider_sort"]
    body: dict = {"provider": provider} if provider else {}
    effort = values["reasoning_effort"]
    if values["reasoning_disabled"]:
        if effort:
            raise UsageError("--reasoning_disabled and --reasoning_effort contradict each other; pass one")
        body["reasoning"] = {"enabled": False}
    elif effort:
        body["reasoning"] = {"effort": effort}
    return body


def _api_key(values: dict) -> str:
    if values["api_key"] is not None:
        return values["api_key"]
    key = os.environ.get("OPENROUTER_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if key:
        return key
    if values["model"] == MOCK or values["check_tasks"]:  # a task check calls no model, so it needs no key
        return "mock"
    if values["base_url"].rstrip("/") == OPENROUTER:
        raise UsageError("no API key: pass --api_key or set OPENROUTER_API_KEY (or OPENAI_API_KEY)")
    return NO_KEY  # local servers (vLLM, llama.cpp) usually accept any key


def export_formats(names: list[str] | None) -> tuple[str, ...]:
    known = registry.EXPORTS.names()
    unknown = [name for name in names or () if name not in known]
    if unknown:
        raise UsageError(f"--export: unknown format {unknown[0]!r}; choose from {', '.join(known)} (comma separated)")
    return tuple(dict.fromkeys(names or ()))


EXTENDING = ("plugins", "tools")  # the flags that extend the registries, loaded before any other flag is read


def load_plugins(flags: dict, kept: dict | None = None, where: Path | None = None) -> tuple[plugins.Plugin, ...]:
    """--plugins and --tools (settled first, against run.json's on --resume), loaded with the built-ins and
    the entry points before any other flag is read: --distribution, --environment, --export and the
    dataset's checks accept what they register."""
    given = settle_flags(tuple(BY_NAME[name] for name in EXTENDING), flags, kept, where)
    found = tuple(plugin for name in EXTENDING for plugin in plugins.read(BY_NAME[name].read(given[name]) or (), name))
    try:
        plugins.load(found)
        chosen = flags["distribution"] if flags["distribution"] is not None else (kept or {}).get("distribution")
        _distribution_file(chosen)
    except registry.RegistryError as exc:
        raise UsageError(str(exc)) from None  # it names the plugin or file
    return found


def _distribution_file(value: object) -> None:
    """--distribution=FILE.json, {toolset: probability from 0 to 1}: a distribution registered under the
    path as given, so that it is a name --distribution accepts (and run.json keeps)."""
    if not (isinstance(value, str) and value.endswith(".json")):
        return
    try:
        chances = json.loads(Path(value).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--distribution: cannot read {value}: {exc}") from None
    valid = (int, float)
    if (
        not isinstance(chances, dict)
        or not chances
        or not all(isinstance(p, valid) and not isinstance(p, bool) and 0 <= p <= 1 for p in chances.values())
    ):
        raise UsageError(f"--distribution: {value} must hold one JSON object {{toolset: probability from 0 to 1}}")
    with registry.registering_as(f"--distribution {value}"):
        registry.distribution(value, {name: chance * 100 for name, chance in chances.items()})


def tool_settings(flags: dict) -> ToolSettings:
    """--vision_model defaults to the main model; search provider and browser come from the environment."""
    vision_model, model, image_model, allow_private = (
        BY_NAME[name].read(flags[name]) for name in ("vision_model", "model", "image_model", "allow_private_urls")
    )
    return ToolSettings.from_environment(
        vision_model if vision_model is not None else model, image_model, allow_private
    )


def _executor(executor: str) -> str:
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise UsageError("--executor=ray needs Ray, which is not installed: pip install -e '.[ray]'")
    return executor


def _opened(flags: dict) -> tuple[dict, dict | None, Path, tuple[plugins.Plugin, ...]]:
    """The flags settled against the run folder's run.json (on --resume), what run.json held, the run
    folder and the plugins, loaded; UsageError for a missing required flag or a run name that is no folder
    name."""
    for flag in ("dataset_file", "run_name"):
        if flags[flag] is None:
            raise UsageError(f"--{flag} is required (see --help)")
    run_dir = Path(str(flags["output_dir"])) / BY_NAME["run_name"].read(flags["run_name"])
    folder = RunFolder(run_dir)
    resume = BY_NAME["resume"].read(flags["resume"])
    if resume and not run_dir.is_dir():  # a mistyped name: a new run would pay for everything again
        raise UsageError(f"--resume: there is no run folder {run_dir}{_closest_runs(run_dir)}")
    kept = folder.load_settings() if resume else None
    fresh = kept is not None and next(iter(folder.batch_lines(lambda _: None)), None) is None
    loaded = load_plugins(flags, kept, folder.settings)
    rescore = BY_NAME["rescore"].read(flags["rescore"])
    if rescore and not resume:
        raise UsageError("--rescore verifies the finished samples of a run again: pass --resume and its --run_name")
    flags = settle(flags, kept, folder.settings, fresh, rescore)
    if flags["batch_size"] is None:
        raise UsageError("--batch_size is required (see --help)")
    if flags["seed"] is None:  # the run seed: drawn once, then kept in run.json like a given one
        flags["seed"] = random.SystemRandom().randrange(2**31)
    if str(flags["distribution"]) not in distributions():
        raise UsageError(
            f"--distribution {flags['distribution']!r} does not exist; choose one of: {', '.join(distributions())}"
        )
    return flags, kept, run_dir, loaded


def _closest_runs(run_dir: Path) -> str:
    """What follows the message: the existing run folders closest to `run_dir`'s name, as --run_name flags."""
    try:
        names = [path.name for path in run_dir.parent.iterdir() if path.is_dir()]
    except OSError:
        names = []
    close = difflib.get_close_matches(run_dir.name, names, n=3, cutoff=0.5)
    if not close:
        return f" (runs in {run_dir.parent}: {', '.join(sorted(names)[:10]) or 'none'})"
    return "; did you mean " + " or ".join(f"--run_name={name}" for name in close) + "?"


def _prices(values: dict) -> Prices | None:
    """USD per million tokens; input and output go together (half a price would be a wrong cost)."""
    given = (values["price_input"], values["price_output"], values["price_cached_input"])
    if given[0] is None or given[1] is None:
        if any(price is not None for price in given):
            raise UsageError("--price_input and --price_output go together (USD per million tokens); pass both")
        return None
    return Prices(*given)


def _money(values: dict, run_dir: Path) -> MoneySettings:
    retries, timeout = values["max_retries"], values["request_timeout"]
    return from_flags(
        MoneySettings,
        values,
        folder=str(run_dir.resolve()),
        cache=not values["no_cache"],
        # No call can hold its reservation longer than all its attempts and the waits between them.
        reservation_ttl=timeout * (retries + 1) + 60.0 * retries + 60.0,
        start=values["num_workers"] * values["concurrency"],
        adaptive=values["adaptive_concurrency"],
    )


def _verify(values: dict) -> VerifySettings:
    if values["verifier"] is not None:  # a missing file or function stops the run here, before any request
        from trajforge.verification.python_verifier import load_verifier

        load_verifier(values["verifier"])
    judge = None if values["judge"] is None else load_rubric(values["judge"])
    if judge is not None:
        if values["verifier"] is not None:
            raise UsageError("--verifier replaces every other check, --judge goes beside them: pass one")
        if problem := judge_problem(judge):
            raise UsageError(f"--judge: {values['judge']}: {problem.replace('verify.judge', 'judge')}")
    return VerifySettings(
        timeout=values["verify_timeout"],
        threshold=values["pass_threshold"],
        reward_range=values["reward_range"],
        verifier=values["verifier"],
        judge=judge,
        judge_samples=values["judge_samples"],
    )


def _judge(values: dict) -> JudgeEndpoint:
    """The judge's endpoint: another endpoint takes --judge_api_key or $JUDGE_API_KEY, never the run's key."""
    given = (values["judge_price_input"], values["judge_price_output"])
    if (given[0] is None) != (given[1] is None):
        raise UsageError("--judge_price_input and --judge_price_output go together (USD per million tokens)")
    key = values["judge_api_key"] if values["judge_api_key"] is not None else os.environ.get("JUDGE_API_KEY")
    if key is not None and values["judge_base_url"] is None:
        raise UsageError("--judge_api_key is for --judge_base_url; the run's own endpoint is asked with its key")
    prices = None if given[0] is None else Prices(given[0], given[1])
    return JudgeEndpoint(values["judge_model"], values["judge_base_url"], key, prices)


def _checked(values: dict, model: ModelSettings) -> None:
    """The rules between flags that no one flag's parser can see."""
    if "rl" in (values["export"] or ()) and model.token_ids == "off":
        raise UsageError("--export=rl builds its rows from token ids: add --token_ids (a new run, or one made with it)")
    if model.token_ids != "off" and (
        values["ephemeral_system_prompt"] is not None or values["prefill_messages_file"] is not None
    ):
        # The prompt's ids hold what the model saw, the never-saved system prompt and prefill included.
        raise UsageError(
            "--token_ids saves the prompt's token ids, which would hold the --ephemeral_system_prompt and "
            "--prefill_messages_file that are never saved: leave those out of a run with --token_ids"
        )


def _settings(kept: dict | None, flags: dict, rescore: bool) -> dict:
    """What run.json keeps: what it held, with what it lacks from now on; each re-scoring with its settings."""
    settings = (kept or {}) | remembered(RUN_SETTINGS, flags)
    if rescore:
        done = {"at": datetime.now(UTC).isoformat(timespec="seconds")} | {name: settings.get(name) for name in RESCORED}
        settings["rescores"] = [*settings.get("rescores", []), done]
    return settings


def build_config(flags: dict, named: frozenset[str] = frozenset()) -> RunConfig:
    """Check every flag; raise UsageError naming the first bad one. `named`: the flags given on the
    command line (a task folder's task.toml gives way to them)."""
    try:
        return dataclasses.replace(_built(flags), given=named)
    except FlagError as exc:
        raise UsageError(str(exc)) from None


def _built(flags: dict) -> RunConfig:
    flags, kept, run_dir, loaded = _opened(flags)
    values = read(flags)
    model = from_flags(
        ModelSettings, values, api_key=_api_key(values), extra_body=_extra_body(values), prices=_prices(values)
    )
    exports = export_formats(values["export"])
    _checked(values, model)
    require = values["require_reasoning"]
    servers = mcp_servers.read(values["mcp_config"] or [], values["command_timeout"], values["setup_timeout"])
    return from_flags(
        RunConfig,
        values,
        run_dir=run_dir,
        model=model,
        environment=from_flags(
            EnvironmentSettings,
            values,
            kind=values["environment"],
            limits=from_flags(Limits, values),
            run_dir=str(run_dir.resolve()),  # labels this run's containers, whatever the cwd of a later --resume
            stdio_servers=any(server.stdio for server in servers),
        ),
        tools=tool_settings(flags),
        prefill=load_prefill(values["prefill_messages_file"]),
        # Without reasoning from the model, the no-reasoning filter would drop every sample.
        require_reasoning=not values["reasoning_disabled"] if require is None else require,
        mock=model.model == MOCK,
        executor=_executor(values["executor"]),
        settings=_settings(kept, flags, values["rescore"]),
        verify=_verify(values),
        judge=_judge(values),
        exports=exports,
        money=_money(values, run_dir),
        changes=tuple(changes(kept_rows(values["rescore"]), flags, kept)),
        retry_failed=tuple(choice(name, "retry_failed", RETRYABLE) for name in values["retry_failed"] or ()),
        plugins=loaded,
        mcp_servers=servers,
    )
