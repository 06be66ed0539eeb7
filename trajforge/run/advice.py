"""Warnings about a run as a whole, said while it runs: what the first samples show about the model or
the server (no reasoning at all, no tool call at all), with the flag that helps."""

from __future__ import annotations

from trajforge.events import PromptDone

WINDOW = 20  # samples looked at before judging; a run with fewer is judged when it ends


class Advice:
    def __init__(self, require_reasoning: bool):
        self.require_reasoning = require_reasoning
        self.samples = self.without_reasoning = self.offered_tools = self.tool_calls = 0
        self.judged = False

    def sample(self, event: PromptDone) -> list[str]:
        """Count one finished sample; the warnings, once, when the window is full."""
        if self.judged:
            return []
        self.samples += 1
        self.without_reasoning += event.outcome == "no_reasoning"
        self.offered_tools += event.tools_offered > 0
        self.tool_calls += event.tool_calls
        return self.judge() if self.samples >= WINDOW else []

    def judge(self) -> list[str]:
        """The warnings the samples so far call for (at most once; the driver also asks when its
        workers are done, for a run of fewer samples than the window)."""
        if self.judged or not self.samples:
            return []
        self.judged = True
        which = f"the first {self.samples}" if self.samples >= WINDOW else f"all {self.samples}"
        warnings = []
        if self.require_reasoning and self.without_reasoning == self.samples:
            warnings.append(
                f"{which} samples came without any reasoning and were discarded (--require_reasoning is on): the "
                "model or server sends no reasoning field and no <think> in the content. Pass "
                "--require_reasoning=False to keep such samples; those discarded so far stay in the batch files, "
                "and --resume --require_reasoning=False merges them in without calling the model again."
            )
        if self.offered_tools and not self.tool_calls:
            warnings.append(
                f"tools were offered to {self.offered_tools} of {which} samples and not one tool was called: the "
                "model, or the server's chat template, may not support tool calling (llama.cpp needs --jinja "
                "and a chat template with tools; vLLM needs --enable-auto-tool-choice and a --tool-call-parser)."
            )
        return warnings
