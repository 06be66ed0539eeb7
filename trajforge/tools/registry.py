"""Which tools exist: one table, toolset -> its tool functions (in the order the model sees them) and
its check, with every schema built once when this module loads. Nothing registers itself on import.

A toolset's check, ``check(settings) -> {tool name, or the toolset's name: why it cannot be offered}``,
runs once at start, in the parent process, when the distribution (or --list_distributions) has the
toolset; what it names is left out of the tools offered to the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trajforge.tools import Tool, code_execution, file, image_gen, terminal, vision, web
from trajforge.tools.browser import tools as browser
from trajforge.tools.settings import ToolSettings

NOT_IMPLEMENTED = "not implemented in this version"
Check = Callable[[ToolSettings], dict[str, str]]

TOOLSETS: dict[str, tuple[Callable, ...]] = {
    "terminal": (terminal.terminal,),
    "file": (file.read_file, file.write_file, file.patch, file.search_files),
    "code_execution": (code_execution.execute_code,),
    "web": (web.web_extract, web.web_search),
    "vision": (vision.vision_analyze,),
    "image_gen": (image_gen.image_generate,),
    "browser": browser.TOOLS,
}
CHECKS: dict[str, Check] = {"web": web.search_configured, "browser": browser.launchable}

BY_TOOLSET: dict[str, list[Tool]] = {
    toolset: [Tool.of(toolset, function) for function in functions] for toolset, functions in TOOLSETS.items()
}
TOOLS: dict[str, Tool] = {t.name: t for tools in BY_TOOLSET.values() for t in tools}


@dataclass(frozen=True)
class Unavailable:
    toolset: str
    tool: str | None  # None: the whole toolset
    reason: str


def available_toolsets(
    settings: ToolSettings, wanted: Iterable[str]
) -> tuple[dict[str, list[Tool]], list[Unavailable]]:
    """The tools this run can offer, per toolset of `wanted`, and what it cannot offer and why."""
    offered: dict[str, list[Tool]] = {}
    missing: list[Unavailable] = []
    for name in dict.fromkeys(wanted):
        if name not in BY_TOOLSET:
            missing.append(Unavailable(name, None, NOT_IMPLEMENTED))
            continue
        problems = CHECKS[name](settings) if name in CHECKS else {}
        if name in problems:  # the toolset's own name: none of its tools can be offered
            missing.append(Unavailable(name, None, problems[name]))
            continue
        missing += [Unavailable(name, tool_name, why) for tool_name, why in problems.items()]
        offered[name] = [t for t in BY_TOOLSET[name] if t.name not in problems]
    return offered, missing
