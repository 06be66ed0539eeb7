"""The flag table as the command line shows it: `main`'s signature (what Fire binds), --help, and
docs/flags.md (`python -m trajforge.cli.flagtext > docs/flags.md`)."""

from __future__ import annotations

import inspect

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
