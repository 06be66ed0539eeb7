"""The flag table as the command line shows it: `main`'s signature (what Fire binds), --help, and
docs/flags.md (`python -m trajforge.cli.flagtext > docs/flags.md`)."""

from __future__ import annotations

import inspect
import os

from trajforge.flags import FLAGS, GROUPS, MAY_CHANGE, PER_INVOCATION, REMEMBERED, Flag


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


EXIT_STATUSES = """\
exit status: 0 done; 1 some prompts failed (a --resume sends them again) or the endpoint refused the key;
  2 bad flags or dataset, or an endpoint that cannot be reached (nothing was sent); 3 the budget (--max_cost)
  was reached and work remains; 4 done, but with prompts no --resume sends again (out of --max_attempts, or
  refused for good by the endpoint); 130 interrupted (checkpoint saved: --resume goes on)"""


def program_name(argv0: str) -> str:
    """How the user started us: `python batch_runner.py` from a checkout, else the installed command."""
    return "python batch_runner.py" if argv0.endswith(".py") else os.path.basename(argv0)


def help_text(version: str, program: str = "python batch_runner.py") -> str:
    """--help: usage, examples and exit statuses, then the flags by group, one line each with its default."""
    lines = [
        f"batch_runner {version}: run a tool-using agent over every prompt of a JSONL dataset",
        f"usage: {program} --dataset_file=FILE --batch_size=N --run_name=NAME [--flag=value ...]",
        f"       {program} --help | --version | --list_distributions",
        "Booleans: --flag or --noflag. [kept]: run.json keeps it for --resume (docs/flags.md: resume rules).",
        "",
        "examples: offline on the scripted model; a local server; continue a stopped run with its own settings",
        f"  {program} --dataset_file=data/example_prompts.jsonl --batch_size=4 --run_name=demo --model=mock",
        f"  {program} --dataset_file=prompts.jsonl --batch_size=10 --run_name=qwen --model=Qwen/Qwen3-8B \\",
        "      --base_url=http://127.0.0.1:8000/v1 --num_workers=2 --concurrency=8",
        f"  {program} --dataset_file=prompts.jsonl --run_name=qwen --resume",
        "",
        EXIT_STATUSES,
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

Generated from the flag table (`trajforge/flags/__init__.py`) by `python -m trajforge.cli.flagtext >
docs/flags.md`; a test checks that this file is what the table gives. `python batch_runner.py --help`
prints the same flags.

Flags are written `--name=value` (or `--name value`); a boolean is `--name` or `--noname`. A misspelt
flag stops the run with exit 2, naming the closest one.

**Numbering.** Dataset entries are numbered from 0 everywhere the runner names them: `prompt_index` in
the records, `errors.jsonl` and the checkpoint, and `prompt N` in messages (its position among the
dataset's non-blank lines). Only the dataset check, which points into the file, names a file line,
counted from 1 as editors do (`line 51`).

**Output.** Results (the summary, output paths, the command that continues a run) go to stdout;
warnings and the progress line go to stderr, so `| head` and `> file` keep only results. With
`--summary_json`, stdout holds the final summary alone, as one JSON object, and the rest goes to stderr.

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
