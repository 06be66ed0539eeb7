"""The command line refuses what Fire would silently leave unused: unknown flags and stray arguments."""

from __future__ import annotations

import inspect

import pytest

import batch_runner
from trajforge.cli.unknown_flags import unknown_argument

FLAGS = inspect.signature(batch_runner.main).parameters


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--dataset_file=data/x.jsonl", "--batch_size=4", "--run_name=demo", "--model=mock"],
        ["--dataset_file", "data/x.jsonl", "--batch_size", "4"],  # --flag value
        ["--dataset-file=x", "--max-turns", "3"],  # hyphens for underscores
        ["--resume", "--verbose", "--noreasoning_disabled"],  # booleans, also as --noflag
        ["--resume", "true", "--stream", "False"],  # a boolean with its value
        ["--seed", "-1"],  # a negative number is a value, not a flag
        ["--run_name=--odd"],  # a value with dashes after =
        [
            "-o",
            "out",
            "-i=gpt-image-1",
        ],  # a unique first letter, as Fire accepts (not -n: three flags)
        ["--help"],
        ["-h"],
        ["--run_name=x", "--", "--trace"],  # Fire's own flags after a lone --
    ],
)
def test_every_spelling_fire_accepts_passes(argv):
    assert unknown_argument(argv, FLAGS) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max_tursn=5"], "unknown flag --max_tursn; did you mean --max_turns?"),
        (["--run_name=x", "--n_sample=3"], "unknown flag --n_sample; did you mean --n_samples?"),
        (["--max-tursn", "5"], "unknown flag --max-tursn; did you mean --max_turns?"),
        (["--concurency", "4"], "unknown flag --concurency; did you mean --concurrency?"),
        (["--noresme"], "unknown flag --noresme; did you mean --resume?"),
        (["--noresume=true"], "unknown flag --noresume; did you mean --resume?"),  # --noflag takes no value
        (["--xyz"], "unknown flag --xyz; see --help for the flags"),
        (["-x"], "unknown flag -x; see --help for the flags"),
        (
            ["-s", "3"],
            "-s could be any of --stream, --seed, --sandbox_network, --setup_timeout, --stop_after_passes, "
            "--summary_json; spell the flag out",
        ),
        (
            ["data/prompts.jsonl"],
            "unexpected argument 'data/prompts.jsonl'; every setting is a flag such as --run_name=NAME (see --help)",
        ),
        (
            ["--resume", "--run_name", "a", "b"],  # "b" would bind to the first parameter
            "unexpected argument 'b'; every setting is a flag such as --run_name=NAME (see --help)",
        ),
    ],
)
def test_the_first_unknown_argument_is_named(argv, message):
    assert unknown_argument(argv, FLAGS) == message


def test_a_misspelled_flag_exits_2_before_any_request(run_here, server):
    result = run_here([{"prompt": "hello"}], "--distribution=terminal_only", "--max_tursn=5")
    assert result.code == 2
    assert result.stderr == "error: unknown flag --max_tursn; did you mean --max_turns?\n"
    assert server.requests == []
    assert not result.run_dir.exists()
