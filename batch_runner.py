"""Run a tool-using agent over every prompt of a JSONL dataset and write ShareGPT trajectories.

python batch_runner.py --dataset_file=data/example_prompts.jsonl --batch_size=4 --run_name=demo --model=mock
python batch_runner.py --dataset_file=data/prompts.jsonl --batch_size=10 --run_name=my_run --resume
python batch_runner.py --list_distributions
"""

from __future__ import annotations

import gc
import json
import sys

import fire
from rich.console import Console

from toolset_distributions import distributions_table, names, weights
from trajforge.cli.config import build_config, load_plugins, settle, tool_settings
from trajforge.cli.flagtext import given, help_text, program_name, signature
from trajforge.cli.repeated import joined
from trajforge.cli.unknown_flags import unknown_argument
from trajforge.environments.programs import absolute_path_only
from trajforge.errors import SetupError, UsageError
from trajforge.flags import BY_NAME, FLAGS
from trajforge.flags.values import FlagError
from trajforge.registry import RegistryError
from trajforge.run.helper_processes import Helpers, signal_handlers_kept
from trajforge.run.task_folders import load_entries
from trajforge.secrets import conceal
from trajforge.version import version

# The runner itself (trajforge.run.runner, trajforge.tools.toolsets) is imported once the run's helpers are
# starting: its imports take about 2 s, most of them the openai package, and the helpers start meanwhile.


def main(**flags) -> None:
    """Run the agent over every prompt of --dataset_file; outputs go to <output_dir>/<run_name>/.

    The flags are the flag table's (trajforge/flags) (python batch_runner.py --help). A flag that run.json keeps is
    None when not given: its default, or with --resume the run's own value, applies then.
    """
    absolute_path_only()  # before any program is found by name, here or in a helper or worker
    named = frozenset(flags)  # Fire passes only the flags given on the command line
    flags = given(flags)
    as_json = _summary_json(flags)
    console = Console(highlight=False, soft_wrap=True, stderr=as_json)  # stdout holds the JSON summary alone
    try:
        if flags["list_distributions"]:
            from trajforge.tools.toolsets import available_toolsets

            load_plugins(flags)
            flags = settle(flags)
            every_toolset = [toolset for name in names() for toolset in weights(name)]
            _, missing = available_toolsets(tool_settings(flags), every_toolset)
            console.print(distributions_table(missing))
            return
        config = build_config(flags, named)
        # Before any helper starts or any worker forks: none of them inherits a secret it could show.
        conceal(config.secrets.texts)
        if config.check_tasks:  # no model, no helpers: only the tasks' own commands
            from trajforge.run.task_check import check_tasks as check

            sys.exit(check(config, console))
        # Before the runner's imports (2 s, the openai package's most of them): a dataset the run refuses, with
        # a line that says why, is refused at once, no helper started.
        entries, notes = load_entries(config)
        with signal_handlers_kept(), Helpers(config) as started:
            # What the imports make lives as long as the process: no garbage collection need walk it, while
            # they run (a tenth of their time), in the run or at exit (where walking openai's types would cost
            # half a second). Frozen once: the tests call main() many times in one process.
            collecting = gc.isenabled()
            gc.disable()
            try:
                from trajforge.run.runner import BatchRunner

                if not gc.get_freeze_count():
                    gc.freeze()
            finally:
                if collecting:
                    gc.enable()
            code = BatchRunner(config, console, started).run(entries, notes)
    except (UsageError, SetupError, FlagError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if as_json:
            print(json.dumps({"exit_status": 2, "error": str(exc)}, ensure_ascii=False))
        sys.exit(2)
    sys.exit(code)


def _summary_json(flags: dict) -> bool:
    try:
        return bool(BY_NAME["summary_json"].read(flags["summary_json"]))
    except FlagError:  # refused with the other flags, by build_config
        return False


main.__signature__ = signature()  # type: ignore[attr-defined]  # what Fire binds: keyword-only flags, from the table


def cli() -> None:
    absolute_path_only()  # before Fire (its pager) or anything else finds a program by name
    if {"-h", "--help", "--version"} & set(sys.argv[1:]):  # ours, not Fire's page (no pager, no type noise)
        print(
            f"batch_runner {version()}"
            if "--version" in sys.argv[1:]
            else help_text(version(), program_name(sys.argv[0])).rstrip("\n")
        )
        sys.exit(0)
    problem = unknown_argument(sys.argv[1:], BY_NAME)
    if problem:  # Fire would leave it unused and the run would go ahead without it
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    fire.Fire(main, command=joined(sys.argv[1:], [flag.name for flag in FLAGS if flag.repeats]))


if __name__ == "__main__":
    cli()
