"""Tool schemas from signatures and docstrings, and call_tool's handling of malformed calls, in-process."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

import pytest

from trajforge import registry
from trajforge.tools import Tool, call_tool
from trajforge.tools.schema import json_type, tool_schema
from trajforge.tools.toolsets import by_toolset, every_tool


async def sample(
    session,
    text: str,
    names: list[str],
    count: int = 3,
    ratio: float | None = None,
    older: Optional[int] = None,  # noqa: UP045 - the typing spelling must work too
    flag: bool = False,
    extra: dict | None = None,
) -> dict:
    """Do something with the text,
    described over two lines.

    Args:
        text: the text to use,
            explained over two lines
        names: names to use
        count: how many times
    """
    return {"text": text, "names": names, "count": count}


async def bare(session, value: int) -> dict:
    return {"value": value}


def test_types_optional_lists_defaults_and_docstring_args():
    assert tool_schema(sample) == {
        "type": "function",
        "function": {
            "name": "sample",
            "description": "Do something with the text, described over two lines.",
            "parameters": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "the text to use, explained over two lines"},
                    "names": {"type": "array", "items": {"type": "string"}, "description": "names to use"},
                    "count": {"type": "integer", "description": "how many times"},
                    "ratio": {"type": "number"},
                    "older": {"type": "integer"},
                    "flag": {"type": "boolean"},
                    "extra": {"type": "object"},
                },
                "required": ["text", "names"],
            },
        },
    }


def test_no_docstring_gives_an_empty_description_and_the_session_is_never_a_parameter():
    function = tool_schema(bare)["function"]
    assert function["description"] == ""
    assert function["parameters"] == {
        "type": "object",
        "properties": {"value": {"type": "integer"}},
        "required": ["value"],
    }


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, {"type": "string"}),
        (int | None, {"type": "integer"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list[str] | None, {"type": "array", "items": {"type": "string"}}),
    ],
)
def test_json_type(annotation, expected):
    assert json_type(annotation) == expected


def test_the_registry_table_is_every_tool_once_each_with_a_session_first():
    names = [function.__name__ for toolset in registry.TOOLSETS.names() for function in registry.TOOLSETS[toolset]]
    assert len(names) == len(set(names)) == len(every_tool())
    for toolset, tools in by_toolset().items():
        for tool in tools:
            assert tool.toolset == toolset and next(iter(tool.signature.parameters)) == "session"
            assert tool.schema["function"]["name"] == tool.name


def call(name: str, raw: str) -> dict:
    return asyncio.run(call_tool("the session", name, raw, {"sample": Tool.of("test", sample)}))


def test_call_tool_runs_a_well_formed_call_with_the_session_first():
    assert call("sample", json.dumps({"text": "x", "names": ["a"]})) == {"text": "x", "names": ["a"], "count": 3}


@pytest.mark.parametrize(
    ("name", "raw", "error"),
    [
        ("other", "{}", "unknown tool 'other'; the tools you can call are: sample"),
        ("sample", "{not json", "the arguments of sample are not valid JSON"),
        ("sample", "[1]", "the arguments of sample must be a JSON object, got list"),
        ("sample", '{"text": "x"}', "bad arguments for sample: missing a required argument: 'names'"),
        ("sample", '{"text": "x", "names": [], "colour": 1}', "bad arguments for sample: got an unexpected keyword"),
    ],
)
def test_call_tool_turns_malformed_calls_into_errors(name, raw, error):
    assert call(name, raw)["error"].startswith(error)
