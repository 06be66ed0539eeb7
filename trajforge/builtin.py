"""The built-ins, registered the way a plugin registers (trajforge/registry.py): by name, with what each
is given as "module:attribute", imported only when a run uses it, so that registering costs nothing at
start (the tools alone take two seconds to import)."""

from __future__ import annotations

from types import ModuleType

from toolset_distributions import DISTRIBUTIONS

TOOLSETS = ("terminal", "file", "code_execution", "web", "vision", "image_gen", "browser")
CHECKED = ("web", "browser")  # toolsets with a check of what this machine can offer
BACKENDS = {
    "local": "trajforge.environments.local:LocalBackend",
    "bwrap": "trajforge.environments.bwrap:BwrapBackend",
    "docker": "trajforge.environments.docker:DockerBackend",
    "singularity": "trajforge.environments.singularity:SingularityBackend",
    "modal": "trajforge.environments.modal:ModalBackend",
}
# format -> its file in export/ (the formats' code: export/formats.py)
EXPORTS = {
    "openai": "openai.jsonl",
    "llamafactory": "llamafactory.json",  # export/llamafactory.py's FILE, which its dataset_info.json names
    "atif": "atif.jsonl",
    "parquet": "trajectories.parquet",
    "rl": "rl.jsonl",  # and rl.parquet beside it when parquet is asked too (export/rl.py)
}
# verification/kinds.py; judge: verification/judge.py
VERIFIERS = {name: "trajforge.verification.kinds" for name in ("command", "final_contains", "final_excludes")}
VERIFIERS |= {"tools_called": "trajforge.verification.kinds", "judge": "trajforge.verification.judge"}


def register(registry: ModuleType) -> None:
    for name in TOOLSETS:
        check = f"trajforge.tools.builtin:{name.upper()}_CHECK" if name in CHECKED else None
        registry.toolset(name, f"trajforge.tools.builtin:{name.upper()}", check=check)
    for name, weights in DISTRIBUTIONS.items():
        registry.distribution(name, weights)
    for name, target in BACKENDS.items():
        registry.backend(name, target)
    for name, file in EXPORTS.items():
        registry.export(name, file, f"trajforge.export.formats:{name.upper()}")
    for name, module in VERIFIERS.items():
        registry.verifier(name, f"{module}:{name.upper()}")
