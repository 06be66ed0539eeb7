"""README.md in the run folder: a HuggingFace dataset card, rewritten at every merge.

The YAML header names a config per data file (trajectories.jsonl and each export), so uploading the
folder (`huggingface-cli upload`) gives a browsable Hub dataset; the prose says how the data was made.
The endpoint appears as its host only: never a key, a path or a query.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

from trajforge.export import loading
from trajforge.runconfig import RunConfig

FILE = "README.md"
MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|])")


def endpoint_host(config: RunConfig) -> str:
    if config.mock:
        return "the built-in mock model (127.0.0.1)"
    parts = urlsplit(config.model.base_url)
    return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else "unknown"


def shaping_flags(config: RunConfig) -> dict[str, str]:
    """Every setting that shaped the data, as the flags the user would pass again. The ephemeral
    system prompt and the prefill are never saved, so only their presence is told."""
    extra = config.model.extra_body
    provider, reasoning = extra.get("provider", {}), extra.get("reasoning", {})
    search = config.tools.search
    flags = {
        "model": config.model.model,
        "base_url": endpoint_host(config),
        "distribution": config.distribution,
        "environment": config.environment.kind,
        "max_turns": config.max_turns,
        "max_tokens": config.model.max_tokens,
        "max_tool_calls_per_turn": config.max_tool_calls_per_turn,
        "prompt_timeout": config.prompt_timeout,
        "command_timeout": config.environment.command_timeout,
        "reasoning_effort": reasoning.get("effort"),
        "reasoning_disabled": reasoning.get("enabled") is False or None,
        "providers_allowed": ",".join(provider.get("only", [])) or None,
        "providers_ignored": ",".join(provider.get("ignore", [])) or None,
        "providers_order": ",".join(provider.get("order", [])) or None,
        "provider_sort": provider.get("sort"),
        "require_reasoning": config.require_reasoning,
        "n_samples": config.n_samples,
        "keep": config.keep,
        "stop_after_passes": config.stop_after_passes,
        "verify_timeout": config.verify.timeout,
        "pass_threshold": config.verify.threshold,
        "verifier": config.verify.verifier,
        "seed": config.seed,
        "token_ids": config.model.token_ids if config.model.token_ids != "off" else None,
        "max_samples": config.max_samples,
        "vision_model": config.tools.vision_model,
        "image_model": config.tools.image_model,
        "web_search": search.name if search else "not offered",
        "allow_private_urls": config.tools.allow_private_urls,
        "sandbox_network": config.environment.sandbox_network,
        "default_image": config.environment.default_image if config.environment.kind != "local" else None,
        "ephemeral_system_prompt": "given (sent, never saved)" if config.ephemeral_system_prompt is not None else None,
        "prefill_messages_file": f"{len(config.prefill)} messages (sent, never saved)" if config.prefill else None,
    }
    return {name: _flag_value(value) for name, value in flags.items() if value is not None}


def _flag_value(value) -> str:
    """As it would be typed: true/false, 3600 rather than 3600.0."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _md(text) -> str:
    return MARKDOWN_SPECIAL.sub(r"\\\1", str(text)).replace("\n", " ")


def _yaml_header(run_name: str, files: dict[str, str]) -> str:
    lines = ["---", f"pretty_name: {json.dumps(run_name + ' (batch-runner trajectories)')}"]
    lines += ["tags:", "- agent", "- tool-use", "- trajectories", "- synthetic"] + (["configs:"] if files else [])
    for number, (name, path) in enumerate(files.items()):
        lines += [f"- config_name: {name}"] + (["  default: true"] if number == 0 else [])
        lines += ["  data_files:", "  - split: train", f"    path: {json.dumps(path)}"]
    return "\n".join([*lines, "---", ""])


def _table(header: tuple[str, ...], rows: list[tuple], code_first: bool = False) -> list[str]:
    """A Markdown table; with `code_first` the first column (our own names) is set as code."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for first, *rest in rows:
        cells = [f"`{first}`" if code_first else _md(first), *(_md(cell) for cell in rest)]
        out.append("| " + " | ".join(cells) + " |")
    return out


def render(stats: dict, flags: dict[str, str], exports: dict[str, str], version: str, commit: str | None) -> str:
    """The card's text; `exports` maps a config name to its file, relative to the run folder. Without
    a trajectory every data file is empty, which `datasets` cannot load: none is listed then."""
    run_name = str(stats.get("run_name", ""))
    files = {"trajectories": "trajectories.jsonl", **exports}
    listed = files if stats.get("trajectories") else {}
    made_by = f"batch-runner {version}" + (f" (git {commit})" if commit else "")
    out = [_yaml_header(run_name, listed), f"# {_md(run_name)}", ""]
    out.append(
        f"Trajectories of a tool-using agent, made by {_md(made_by)} with the model {_md(flags.get('model', ''))} "
        f"at {_md(flags.get('base_url', ''))}, from the dataset file {_md(stats.get('dataset_file', ''))}."
    )
    out += ["", "## Contents", ""]
    out.append(
        f"{stats.get('trajectories', 0)} trajectories ({stats.get('completed', 0)} completed, "
        f"{stats.get('partial', 0)} partial: a limit such as --max_turns ended them) from "
        f"{stats.get('total_prompts', 0)} dataset entries; {stats.get('failed', 0)} prompts failed "
        f"and {stats.get('remaining', 0)} entries have no trajectory yet."
    )
    out += ["", *_table(("config", "file"), list(listed.items()))]
    out += ["", "Each line of trajectories.jsonl is one trajectory in ShareGPT form (system, human, gpt, tool turns)"]
    out += ["with its metadata, tool statistics and outcome; the exports hold the same trajectories."]
    out += ["", "## Filters", ""]
    out.append(
        f"- no reasoning in any assistant turn: {stats.get('discarded_no_reasoning', 0)} dropped "
        f"(`--require_reasoning={flags.get('require_reasoning', 'true')}`)"
    )
    out.append(f"- called a tool it was not offered: {stats.get('discarded_hallucinated_tools', 0)} dropped")
    for key, value in (stats.get("verification") or {}).items():
        out.append(f"- verification {_md(key)}: {_md(value)}")
    errors = stats.get("errors") or {}
    if errors:
        out.append("- failed prompts by error: " + ", ".join(f"{_md(k)} {v}" for k, v in errors.items()))
    flag_rows = [(f"--{name}", value) for name, value in flags.items()]
    out += ["", "## How it was made", "", *_table(("flag", "value"), flag_rows, code_first=True)]
    used = [(name, e["count"], e["success"], e["failure"]) for name, e in stats.get("tool_statistics", {}).items()]
    used = [row for row in used if row[1]]
    out += ["", "## Tool usage", ""]
    out += _table(("tool", "calls", "success", "failure"), used, code_first=True) if used else ["No tool calls."]
    reasoning = stats.get("reasoning_statistics") or {}
    out += ["", "## Reasoning coverage", ""]
    out.append(
        f"{reasoning.get('turns_with_reasoning', 0)} of {reasoning.get('total_assistant_turns', 0)} assistant turns "
        f"carry reasoning ({reasoning.get('coverage', 0.0):.1%})."
    )
    usage = stats.get("usage") or {}
    cost = usage.get("cost")
    out += ["", "## Usage and cost", ""]
    out.append(
        f"{usage.get('prompt_tokens', 0):,} prompt tokens, {usage.get('completion_tokens', 0):,} completion tokens "
        f"({usage.get('reasoning_tokens', 0):,} reasoning), {usage.get('total_tokens', 0):,} in all; cost "
        + (f"${cost:.4f}" if isinstance(cost, (int, float)) else "unknown")
        + f"; {stats.get('duration_seconds', 0):.0f} s of running."
    )
    code = [f'trajectories = load_dataset("json", data_files="{files["trajectories"]}", split="train")']
    if "openai" in files:
        code += [loading.load_line("openai", files["openai"], "messages")]
    out += ["", "## Load it", "", "```python", loading.import_line("\n".join(code)), "", *code, "```", ""]
    if "openai" in files:
        out.append(
            'Each row of the openai export renders as is with `tokenizer.apply_chat_template(row["messages"], '
            'tools=row["tools"])`; the features (datasets >= 5, for its `Json` feature) let files of '
            "several runs load together in any order, whatever tools they offered."
        )
        out.append("")
    return "\n".join(out)
