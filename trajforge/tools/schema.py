"""A tool's JSON schema from its function: the signature gives the parameters, their types and which
are required (no default); the docstring gives the description and, in its ``Args:`` lines, each
parameter's description. The first parameter (the session) is not the model's to fill."""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


def json_type(annotation) -> dict:
    """The JSON schema of a parameter's type: the basic types, `X | None` as X, and list[X]."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return {"type": "array", "items": json_type(item)}
    return {"type": _JSON_TYPES[annotation]}


def tool_schema(function: Callable) -> dict:
    """The OpenAI tool object: {"type": "function", "function": {name, description, parameters}}."""
    doc = inspect.getdoc(function) or ""
    description, _, args_text = doc.partition("\nArgs:\n")
    arg_docs = dict(re.findall(r"^ {4}(\w+): (.+(?:\n {8,}.+)*)", args_text, re.M))
    hints = typing.get_type_hints(function)
    properties, required = {}, []
    for name, param in list(inspect.signature(function).parameters.items())[1:]:  # skip the session
        prop = json_type(hints[name])
        if name in arg_docs:
            prop["description"] = " ".join(arg_docs[name].split())
        properties[name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": function.__name__, "description": " ".join(description.split()), "parameters": parameters},
    }
