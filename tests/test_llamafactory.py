"""export/llamafactory.json and dataset_info.json through LLaMA-Factory's own code: its dataset_info
parser, its sharegpt converter (role order, function_call/observation positions, even count), and its
function-call and tool formatters (the `function_call` values and the `tools` column), on a run with
parallel calls, broken arguments, several turns and a session cut at --max_turns.

LLaMA-Factory's package imports torch and peft from its `__init__`s; these four modules need neither
(the standard library, `datasets`, `fsspec`), so the test loads them from the installed package with its
logging, constants and misc modules stood in for (`pip install --no-deps llamafactory`); where it is
not installed the same rules are applied by tests/test_exports.py's position test."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import re
import sys
import types
from pathlib import Path

import pytest
from test_chat_templates import recorded_calls

SPEC = importlib.util.find_spec("llamafactory")  # finds the package without running its __init__


@pytest.fixture
def llamafactory(monkeypatch):
    if SPEC is None or not SPEC.submodule_search_locations:
        pytest.skip("LLaMA-Factory is not installed (pip install --no-deps llamafactory)")
    root = Path(next(iter(SPEC.submodule_search_locations)))
    logger = logging.getLogger("llamafactory-test")
    logger.warning_rank0 = logger.warning_rank0_once = logger.info_rank0 = logger.warning
    stand_ins = {
        "llamafactory": {"__path__": [str(root)]},
        "llamafactory.extras": {"__path__": [str(root / "extras")]},
        "llamafactory.data": {"__path__": [str(root / "data")]},
        "llamafactory.extras.logging": {"get_logger": lambda name=None: logger},
        "llamafactory.extras.constants": {"DATA_CONFIG": "dataset_info.json"},
        "llamafactory.extras.misc": {"use_modelscope": lambda: False, "use_openmind": lambda: False},
    }
    before = set(sys.modules)
    for name, attributes in stand_ins.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    modules = {name: importlib.import_module(f"llamafactory.data.{name}") for name in ("parser", "converter")}
    modules["formatter"] = importlib.import_module("llamafactory.data.formatter")
    yield types.SimpleNamespace(**modules)
    for name in set(sys.modules) - before:
        if name.startswith("llamafactory"):
            del sys.modules[name]


def test_llamafactory_reads_every_row_as_a_valid_sharegpt_conversation(run_here, llamafactory):
    entries = [
        {"prompt": "all at once [mock calls=3]"},
        {"prompt": "broken [mock bad_json]"},
        {"prompt": "explore [mock turns=3 calls=1]"},
        {"prompt": "cut short [mock turns=6 calls=1]"},  # --max_turns ends it after a tool result
    ]
    result = run_here(entries, "--distribution=terminal_only", "--max_turns=4", "--export=llamafactory")
    assert result.code == 0, result.stdout + result.stderr
    export = result.run_dir / "export"
    (attr,) = llamafactory.parser.get_dataset_list(["run"], str(export))  # dataset_info.json, read by LLaMA-Factory
    assert (attr.load_from, attr.dataset_name, attr.formatting) == ("file", "llamafactory.json", "sharegpt")
    assert attr.system is None and attr.tools == "tools"  # no system column: the template lists the tools
    converter = llamafactory.converter.SharegptDatasetConverter(attr, types.SimpleNamespace(media_dir=""))
    qwen = llamafactory.formatter.FunctionFormatter(slots=["{{content}}"], tool_format="qwen")
    tools = llamafactory.formatter.ToolFormatter(tool_format="qwen")
    rows = json.loads((export / attr.dataset_name).read_text())
    assert len(rows) == len(result.trajectories) == 4
    for row, record in zip(rows, result.trajectories, strict=True):
        converted = converter(row)
        assert converted["_prompt"] and converted["_response"], row  # not dropped as "abnormal"
        assert converted["_system"] == ""
        listing = tools.apply(content=converted["_tools"])[0]  # its own tool prompt, from the tools column
        assert all(f'"name": "{t["name"]}"' in listing for t in json.loads(converted["_tools"]))
        written = []
        for message in converted["_prompt"] + converted["_response"]:
            if message["role"] == "function":
                (text,) = qwen.apply(content=message["content"], thought_words=("<think>\n", "\n</think>\n\n"))
                written += [json.loads(found) for found in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)]
        # Every call, in order, the object the model wrote (a session cut after a tool result ends at its
        # last function_call: only that result, which no answer follows, is left out).
        assert written == recorded_calls(record)
