"""The run's secrets, and where they must never show: saved files, log lines, the process table.

Three kinds: the API keys (the endpoint's, a search provider's), the ephemeral system prompt and each
prefill message. Exact copies are replaced by a marker, also in their JSON-escaped forms (tool-call
arguments and tool results are JSON text). Texts shorter than MIN_LENGTH are left alone: a one-word
prefill must not blank out every "the" of a trajectory.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from trajectory import Turn

MIN_LENGTH = 8
KINDS = {"api_key": "[redacted]", "ephemeral_prompt": "[ephemeral prompt]", "prefill": "[prefill]"}


@dataclass(frozen=True)
class Secret:
    kind: str  # a key of KINDS
    forms: tuple[str, ...]  # the text as it is and as it appears inside JSON strings


def _forms(text: str) -> tuple[str, ...]:
    found = [text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]]
    return tuple(dict.fromkeys(found))  # distinct, in order


class Secrets:
    def __init__(
        self, keys: Iterable[str | None] = (), ephemeral_prompt: str | None = None, prefill: Iterable[str] = ()
    ):
        named = [("api_key", key) for key in keys if key]
        named += [("ephemeral_prompt", ephemeral_prompt)] if ephemeral_prompt else []
        named += [("prefill", text) for text in prefill]
        kinds: dict[str, str] = {}
        for kind, text in named:  # in that order: a text that is both a key and a prefill is masked as a key
            if len(text) >= MIN_LENGTH:
                kinds.setdefault(text, kind)
        self.texts = tuple(kinds)
        # Longest first, so a prefill message that quotes the ephemeral prompt is masked whole.
        ordered = sorted(kinds.items(), key=lambda item: -len(item[0]))
        self.secrets = tuple(Secret(kind, _forms(text)) for text, kind in ordered)

    def redact(self, text: str, counts: Counter | None = None) -> str:
        """`text` with every secret replaced by its marker; replacements are added to `counts`."""
        for secret in self.secrets:
            for form in secret.forms:
                found = text.count(form)
                if found:
                    text = text.replace(form, KINDS[secret.kind])
                    if counts is not None:
                        counts[secret.kind] += found
        return text

    def redact_value(self, value, counts: Counter | None = None):
        """A JSON-able value with every string in it (dict keys too) redacted."""
        if isinstance(value, str):
            return self.redact(value, counts)
        if isinstance(value, dict):
            return {self.redact(k, counts): self.redact_value(v, counts) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact_value(item, counts) for item in value]
        return value

    def redact_turns(self, turns: list[Turn], counts: Counter) -> None:
        """Mask, in place, whatever the model wrote (content, reasoning, its calls) and the tool results."""
        for turn in turns:
            turn.content = self.redact(turn.content, counts)
            turn.reasoning = self.redact(turn.reasoning, counts)
            for call in turn.calls:
                call.id = self.redact(call.id, counts)
                call.name = self.redact(call.name, counts)
                call.arguments = self.redact(call.arguments, counts)
                call.result = self.redact_value(call.result, counts)


def conceal(texts: Iterable[str]) -> None:
    """Hide secrets that reached this process from outside: drop the environment variables that hold
    them (children do not inherit them) and overwrite them with '*' where /proc/<pid>/cmdline and
    /proc/<pid>/environ read (the memory the kernel wrote argv and the environment to at exec, which
    forked workers share). Python keeps its own copies (sys.argv, os.environ), so nothing here needs
    those bytes any more. Best effort: a kernel without /proc leaves them as they are."""
    texts = [text for text in texts if len(text) >= MIN_LENGTH]
    for name in [name for name, value in os.environ.items() if any(text in value for text in texts)]:
        del os.environ[name]
    needles = [text.encode() for text in texts]
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        # After the command name: field 3 is fields[0]; arg_start..env_end are fields 48 to 51.
        regions = [(int(fields[45]), int(fields[46])), (int(fields[47]), int(fields[48]))]
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            for start, end in regions:
                memory.seek(start)
                data = memory.read(end - start)
                masked = data
                for needle in needles:
                    masked = masked.replace(needle, b"*" * len(needle))
                if masked != data:
                    memory.seek(start)
                    memory.write(masked)
    except (OSError, IndexError, ValueError):
        return
