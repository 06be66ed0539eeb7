"""Run a tool-using agent over every prompt of a JSONL dataset and write ShareGPT trajectories.

python batch_runner.py --dataset_file=data/example_prompts.jsonl --batch_size=4 --run_name=demo --model=mock
python batch_runner.py --dataset_file=data/prompts.jsonl --batch_size=10 --run_name=my_run --resume
python batch_runner.py --list_distributions
"""

from __future__ import annotations

import gc
import inspect
import sys

import fire
from rich.console import Console

from toolset_distributions import DISTRIBUTIONS, distributions_table
from trajforge.config import build_config, settle, tool_settings
from trajforge.dataset import UsageError
from trajforge.environments import SetupError
from trajforge.flags import unknown_argument
from trajforge.helpers import Helpers, signal_handlers_kept
from trajforge.secrets import conceal

# The runner itself (trajforge.runner, trajforge.tools.registry) is imported once the run's helpers are
# starting: its imports take about 2 s, most of them the openai package, and the helpers start meanwhile.


def main(
    dataset_file: str | None = None,
    batch_size: int | None = None,
    run_name: str | None = None,
    distribution: str | None = None,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    max_turns: int | None = None,
    num_workers: int = 4,
    resume: bool = False,
    verbose: bool = False,
    max_samples: int | None = None,
    max_tokens: int | None = None,
    providers_allowed: str | None = None,
    providers_ignored: str | None = None,
    providers_order: str | None = None,
    provider_sort: str | None = None,
    reasoning_effort: str | None = None,
    reasoning_disabled: bool | None = None,
    ephemeral_system_prompt: str | None = None,
    log_prefix_chars: int = 100,
    prefill_messages_file: str | None = None,
    list_distributions: bool = False,
    concurrency: int = 1,
    seed: int | None = None,
    require_reasoning: bool | None = None,
    command_timeout: float = 180,
    request_timeout: float = 600,
    prompt_timeout: float = 3600,
    max_tool_calls_per_turn: int | None = None,
    max_retries: int = 6,
    stream: bool = False,
    output_dir: str = "data",
    vision_model: str | None = None,
    image_model: str | None = None,
    environment: str | None = None,
    default_image: str | None = None,
    keep_workspaces: bool = False,
    sandbox_network: bool | None = None,
    max_processes: int = 256,
    max_memory_mb: int = 4096,
    max_file_size_mb: int = 1024,
    allow_private_urls: bool | None = None,
    executor: str = "pool",
    ray_address: str | None = None,
    ray_shared_fs: bool = False,
    n_samples: int | None = None,
    verify_timeout: float | None = None,
    pass_threshold: float | None = None,
    reward_range: str | None = None,
    verifier: str | None = None,
    keep: str = "all",
    stop_after_passes: int | None = None,
    export: str | None = None,
    report: bool = True,
    report_max_trajectories: int = 2000,
    price_input: float | None = None,
    price_output: float | None = None,
    price_cached_input: float | None = None,
    max_cost: float | None = None,
    max_cost_per_prompt: float | None = None,
    max_tokens_per_prompt: int | None = None,
    max_requests_per_minute: float | None = None,
    max_tokens_per_minute: float | None = None,
    no_cache: bool = False,
) -> None:
    """Run the agent over every prompt of --dataset_file; outputs go to <output_dir>/<run_name>/.

    See README.md for every flag. --require_reasoning defaults to true (false with --reasoning_disabled).
    A flag that shapes the data (config.RUN_SETTINGS: --model, --base_url, --distribution, ...) is None
    when not given: its default, or with --resume the run's own value from run.json, applies then.
    """
    console = Console(highlight=False, soft_wrap=True)
    if list_distributions:
        from trajforge.tools import registry

        every_toolset = [name for weights in DISTRIBUTIONS.values() for name in weights]
        _, missing = registry.available_toolsets(tool_settings(settle(dict(locals()))), every_toolset)
        console.print(distributions_table(missing))
        return
    try:
        config = build_config(dict(locals()))
        # Before any helper starts or any worker forks: none of them inherits a secret it could show.
        conceal(config.secrets.texts)
        with signal_handlers_kept(), Helpers(config) as started:
            from trajforge.runner import BatchRunner

            # What the imports made lives as long as the process: no garbage collection need walk it again,
            # in the run or at exit (where walking openai's types would cost half a second). Once: the
            # tests call main() many times in one process.
            if not gc.get_freeze_count():
                gc.freeze()
            code = BatchRunner(config, console, started).run()
    except (UsageError, SetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)


def cli() -> None:
    problem = unknown_argument(sys.argv[1:], inspect.signature(main).parameters)
    if problem:  # Fire would leave it unused and the run would go ahead without it
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    fire.Fire(main)


if __name__ == "__main__":
    cli()
