"""What extends a run, loaded before any flag is checked: the built-ins (trajforge/builtin.py), then every
installed package's entry point in the group `batch_runner.plugins`, then `--plugins` (module names or
.py files), then `--tools`, in that order. Each plugin is a module with `register(registry)` (an entry point
may name the function itself); each `--tools` module is a toolset of its public functions (own_tools.py).
A load starts from empty tables, so a process that runs twice holds only its second run's.

A file's text is read once, here: Ray workers load that text (the file need not be on their node); a
module name must be importable on every node. A plugin that cannot be loaded is a UsageError (exit 2)
naming it, and the line where it failed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from trajforge import builtin, own_tools, registry
from trajforge.errors import UsageError

GROUP = "batch_runner.plugins"


@dataclass(frozen=True)
class Plugin:
    spec: str  # as given: a module name, or a path ending in .py
    text: str | None = None  # a file's source
    flag: str = "plugins"  # the flag that gave it: plugins (register(registry)) or tools (its functions)

    @property
    def toolset(self) -> str:
        """A --tools file's or module's toolset: named after it."""
        return Path(self.spec).stem if self.text is not None else self.spec

    @property
    def module_name(self) -> str:
        """A file's module: named by its content, the same in every process that loads it."""
        if self.text is None:
            return self.spec
        digest = hashlib.sha256(self.text.encode()).hexdigest()[:12]
        return f"batch_runner_plugin_{Path(self.spec).stem.replace('-', '_')}_{digest}"


def read(specs: Iterable[str], flag: str = "plugins") -> tuple[Plugin, ...]:
    """--plugins or --tools: each a module name or a .py file (read now)."""
    found = []
    for spec in specs:
        if not spec.endswith(".py"):
            found.append(Plugin(spec, flag=flag))
            continue
        try:
            found.append(Plugin(spec, Path(spec).read_text(), flag))
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--{flag}: cannot read {spec}: {exc}") from None
    return tuple(found)


def load(plugins: tuple[Plugin, ...] = ()) -> None:
    """Fill the registry: the built-ins, the entry points, then `plugins`."""
    for table in registry.TABLES:
        table.clear()
    with registry.registering_as(registry.BUILT_IN):
        builtin.register(registry)
    for point in entry_points(group=GROUP):
        _register(f"entry point {point.name} ({point.value})", point.load, None)
    for plugin in plugins:
        _register(f"--{plugin.flag} {plugin.spec}", functools.partial(_import, plugin), plugin)


def _register(where: str, get: Callable[[], object], plugin: Plugin | None) -> None:
    try:
        found = get()
        hook: object = getattr(found, "register", None) if isinstance(found, ModuleType) else found
        if plugin is not None and plugin.flag == "tools" and isinstance(found, ModuleType):
            hook = functools.partial(own_tools.register, found, plugin.toolset, where)
        if not callable(hook):
            raise UsageError(f"{where}: defines no register(registry) function")
        with registry.registering_as(where):
            hook(registry)
    except (UsageError, registry.RegistryError):
        raise
    except Exception as exc:
        raise UsageError(f"{where}{_line(exc, plugin)}: {type(exc).__name__}: {exc}") from None


def _import(plugin: Plugin) -> ModuleType:
    if plugin.text is None:
        return importlib.import_module(plugin.spec)
    name = plugin.module_name
    if name in sys.modules:  # loaded from the same text before (a second run in one process)
        return sys.modules[name]
    module = ModuleType(name)
    module.__file__ = str(Path(plugin.spec).resolve())
    code = compile(plugin.text, module.__file__, "exec")
    sys.modules[name] = module  # pickled functions of it name it; Ray workers load the same text
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _line(exc: Exception, plugin: Plugin | None) -> str:
    """', line N' of the plugin's file where it failed, when it did in that file."""
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f", line {exc.lineno}"
    path = str(Path(plugin.spec).resolve()) if plugin and plugin.text is not None else None
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == path]
    return f", line {lines[-1]}" if lines else ""
