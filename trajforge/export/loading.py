"""The `datasets` features that load export/openai.jsonl and preferences.jsonl of any number of runs in
one `load_dataset("json", ...)`, in any order (datasets >= 5, for its `Json` feature).

Without them `datasets` types `tools` (and a call's arguments) from the first file, or the first 10 MB
of one, as a struct of that file's tool parameters, and then fails to cast a file whose tools take other
parameters. `Json` keeps each value as written, whatever its shape. Here as the text a user types (the
dataset card and docs/exports.md show it) and as the Features it means (`features(name)`).
"""

from __future__ import annotations

import re

FEATURES = {
    "openai": (
        '{"messages": List(Json()), "tools": List(Json()), "prompt_index": Value("int64"), '
        '"sample_index": Value("int64"), "reward": Value("float64"), "model": Value("string"), '
        '"run_name": Value("string")}'
    ),
    "preferences": (
        '{"prompt": List(Json()), "chosen": List(Json()), "rejected": List(Json()), "tools": List(Json()), '
        '"prompt_index": Value("int64"), "chosen_reward": Value("float64"), "rejected_reward": Value("float64")}'
    ),
}
NAMES = ("Features", "Json", "List", "Value")  # what the features of load_line() may name


def import_line(code: str) -> str:
    """The import of `code` that loads files: load_dataset and only the feature types it names."""
    used = [name for name in NAMES if re.search(rf"\b{name}\(", code)]
    return f"from datasets import {', '.join([*used, 'load_dataset'])}" + ("  # datasets >= 5" if used else "")


def load_line(name: str, path: str, variable: str) -> str:
    """The line that loads `path` (a file of kind `name`) with its features."""
    return f'{variable} = load_dataset("json", data_files="{path}", split="train", features=Features({FEATURES[name]}))'


def features(name: str):
    """datasets.Features for a file of kind `name` (imports datasets)."""
    from datasets import Features, Json, List, Value

    return Features(eval(FEATURES[name], {"Json": Json, "List": List, "Value": Value}))  # our own constant text
