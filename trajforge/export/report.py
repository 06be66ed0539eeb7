"""report.html in the run folder: one self-contained page (styles, script and data inline, no network)
to look at a run: the run at a glance, charts, a trajectory browser and the failed prompts.

The data is hostile (model-written text, web pages): it goes into the page only as JSON inside a
`<script type="application/json">` block with `<`, `>`, `&`, U+2028 and U+2029 escaped, so nothing in
it can end that block, and the page's script renders every string with textContent. A Content
Security Policy with a per-page nonce backs this up: no other script, style or request can run.

The summary and charts cover every finished sample; the browser embeds at most `limit` of them,
discarded and verification-failed ones first, then a deterministic sample (the smallest hashes of
their identity), and each long text is cut at TEXT_LIMIT characters with a marker.
"""

from __future__ import annotations

import hashlib
import heapq
import html
import json
import secrets
from collections import Counter
from datetime import UTC, datetime
from importlib import resources
from itertools import count

from trajectory import known_cost, known_reward, verification_passed
from trajforge.failures import BUDGET, failure_class
from trajforge.journal.sample import Sample
from trajforge.runfolder.attempts import History, line_unit
from trajforge.runfolder.folder import RunFolder, entry_key, write_atomic
from trajforge.safejson import dumps

FILE = "report.html"
TEXT_LIMIT = 4000
HISTOGRAM_BINS = 20
SETUP_FAILED = "setup_failed"  # the task's own setup failed: not the model's failure, listed apart
# What must never appear raw inside the JSON block: a `</script>` or `<!--` would end or bend it.
ESCAPES = {
    b"<": b"\\u003c",
    b">": b"\\u003e",
    b"&": b"\\u0026",
    "\u2028".encode(): b"\\u2028",
    "\u2029".encode(): b"\\u2029",
}


def cut(text: str, limit: int = TEXT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [{len(text) - limit:,} more characters; the whole text is in the run folder]"


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of a prompt, cut at `limit` characters."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _identity(sample: Sample) -> tuple:
    # The entry as the record's `metadata.source` has it: JSON text (a dict in the oldest records).
    legacy = sample.legacy
    source = legacy["metadata"].get("source") if legacy else json.dumps(sample.entry, ensure_ascii=False)
    key = entry_key(source) if isinstance(source, dict) else str(source)
    return sample.prompt_index, sample.sample_index, key


def _compact(sample: Sample, verdict: str | None) -> dict:
    """What the browser shows of one trajectory: strings cut, tool calls with their results by id."""
    passed = verification_passed(sample.verification)
    usage = sample.usage
    used = sorted({call.name for step in sample.turns for call in step.calls})
    return {
        "prompt_index": sample.prompt_index,
        "sample_index": sample.sample_index,
        "kept": verdict is None,
        "discard": verdict or "",
        "exit_reason": sample.exit_reason,
        "passed": passed,
        "reward": known_reward(sample.verification),  # 0.0 in the record when unverified
        "toolsets": [str(t) for t in sample.toolsets],
        "tools": used,
        "first_line": first_line(sample.prompt),
        "duration_seconds": sample.duration_seconds,
        "usage": usage | {"cost": known_cost(usage)},  # the page shows a null cost as unknown
        "api_calls": sample.api_calls,
        "timestamp": sample.timestamp,
        "system": cut(sample.system),
        "prompt": cut(sample.prompt),
        "steps": [
            {
                "reasoning": cut(step.reasoning),
                "content": cut(step.content),
                "finish_reason": step.finish_reason,
                "calls": [
                    {
                        "id": call.id,
                        "name": call.name,
                        "arguments": cut(call.arguments),
                        "result": cut(call.result_text()),
                        "answered": call.has_result,
                        "ok": call.ok,
                    }
                    for call in step.calls
                ],
            }
            for step in sample.turns
        ],
    }


def _by_prompt(trajectory: dict) -> tuple:
    return trajectory["prompt_index"] or 0, trajectory["sample_index"] or 0


def histogram(values: list[float], bins: int = HISTOGRAM_BINS) -> dict:
    """{edges, counts} over `values`; one bin when they are all the same."""
    if not values:
        return {"edges": [], "counts": []}
    low, high = min(values), max(values)
    if high == low:
        return {"edges": [low, high], "counts": [len(values)]}
    width = (high - low) / bins
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / width), bins - 1)] += 1
    return {"edges": [round(low + i * width, 4) for i in range(bins + 1)], "counts": counts}


class ReportData:
    """Fed every finished sample by the merge (`observe`), in one pass: totals for the charts over all
    of them, and the `limit` samples the browser embeds."""

    def __init__(self, limit: int):
        self.limit = limit
        self.chosen: list = []  # a max-heap (negated keys) of the `limit` smallest (priority, hash)
        self.order = count()
        self.total = 0
        self.turns: Counter = Counter()
        self.durations: list[float] = []
        self.rewards: list[float] = []
        self.outcomes: Counter = Counter()
        self.exit_reasons: Counter = Counter()
        self.verification: Counter = Counter()

    def observe(self, sample: Sample, verdict: str | None) -> None:
        self.total += 1
        passed = verification_passed(sample.verification)
        self.outcomes[verdict or ("completed" if sample.completed else "partial")] += 1
        self.exit_reasons[sample.exit_reason] += 1
        self.verification["unverified" if passed is None else "passed" if passed else "failed"] += 1
        self.turns[len(sample.turns)] += 1
        if isinstance(sample.duration_seconds, (int, float)):
            self.durations.append(float(sample.duration_seconds))
        if passed is not None and isinstance(sample.reward, (int, float)):
            self.rewards.append(float(sample.reward))
        if not self.limit:
            return
        priority = 0 if verdict is not None or passed is False else 1
        digest = hashlib.blake2b(repr(_identity(sample)).encode(), digest_size=8).digest()
        key = (-priority, -int.from_bytes(digest, "big"))
        if len(self.chosen) < self.limit:
            heapq.heappush(self.chosen, (*key, next(self.order), _compact(sample, verdict)))
        elif key > self.chosen[0][:2]:
            heapq.heapreplace(self.chosen, (*key, next(self.order), _compact(sample, verdict)))

    def trajectories(self) -> list[dict]:
        """The embedded ones: discarded and failed first, then by prompt and sample."""
        shown = [entry[-1] for entry in self.chosen]
        first = [t for t in shown if not t["kept"] or t["passed"] is False]
        rest = [t for t in shown if t["kept"] and t["passed"] is not False]
        return sorted(first, key=_by_prompt) + sorted(rest, key=_by_prompt)

    def charts(self, stats: dict) -> dict:
        tools = [
            [name, entry.get("count", 0), entry.get("failure", 0)]
            for name, entry in (stats.get("tool_statistics") or {}).items()
            if entry.get("count")
        ]
        return {
            "tools": sorted(tools, key=lambda row: -row[1]),
            "turns": sorted(self.turns.items()),
            "durations": histogram(self.durations),
            "rewards": histogram(self.rewards) if self.rewards else None,
        }


def failed_prompts(
    folder: RunFolder, settled: set[str], limit: int, max_attempts: int, setup: bool = False
) -> tuple[list[dict], int]:
    """(the last error of each prompt with work left to run, at most `limit` of them; how many);
    `settled`: the entry keys with nothing left to run. `setup`: only the prompts whose task's setup
    failed (no model call made), else only the others: the two are shown apart. Each says its failure
    class, its tries so far and whether a --resume sends it again (runfolder/attempts.py)."""
    last: dict[str, dict] = {}
    for line in folder.error_lines():
        source = line.get("source")
        key = entry_key(source) if isinstance(source, dict) else repr(line.get("prompt_index"))
        if key not in settled and failure_class(str(line.get("error_type", ""))) != BUDGET:  # a stop, no failure
            last[key] = line
    last = {key: line for key, line in last.items() if (line.get("error_type") == SETUP_FAILED) == setup}
    if not last:
        return [], 0
    shown = []
    history = History.read(folder)
    for line in list(last.values())[:limit]:
        source = sent if isinstance(sent := line.get("source"), dict) else {}
        prompt = text if isinstance(text := source.get("prompt"), str) else ""
        unit = line_unit(line) or ""
        shown.append(
            {
                "prompt_index": line.get("prompt_index"),
                "first_line": first_line(prompt),
                "error_type": str(line.get("error_type", "")),
                "error_class": str(line.get("error_class") or failure_class(str(line.get("error_type", "")))),
                "tries": history.tries[unit],
                "held_back": history.held_back(unit, max_attempts, ()) or "",
                "message": cut(str(line.get("message", "")), 2000),
                "attempts": line.get("attempts"),
                "time": str(line.get("time", "")),
            }
        )
    return shown, len(last)


def embed(data: dict) -> bytes:
    """JSON that cannot end the <script> block it sits in, whatever its strings hold."""
    text = dumps(data)
    for raw, escaped in ESCAPES.items():
        text = text.replace(raw, escaped)
    return text


def _asset(name: str) -> str:
    return resources.files("trajforge.export").joinpath("assets", name).read_text(encoding="utf-8")


def page(data: dict) -> bytes:
    nonce = secrets.token_urlsafe(16)
    title = html.escape(str(data.get("run_name", "")))
    policy = f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; img-src data:"
    head = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{title} · batch-runner report</title>\n"
        f'<style nonce="{nonce}">{_asset("report.css")}</style></head>\n'
        f'<body><header><h1 id="run-name">{title}</h1><p id="run-meta"></p></header>\n'
        f"{_asset('report.html')}\n"
        '<script type="application/json" id="report-data">'
    )
    tail = f'</script>\n<script nonce="{nonce}">{_asset("report.js")}</script>\n</body></html>\n'
    return head.encode() + embed(data) + tail.encode()


def write_report(folder: RunFolder, stats: dict, collected: ReportData, settled: set[str]) -> None:
    most = stats["max_attempts"]
    failed, failed_total = failed_prompts(folder, settled, collected.limit, most)
    setup_failed, setup_failed_total = failed_prompts(folder, settled, collected.limit, most, setup=True)
    trajectories = collected.trajectories()
    data = {
        "run_name": stats.get("run_name", ""),
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "statistics": stats,
        "summary": {
            "finished": collected.total,
            "outcomes": dict(collected.outcomes),
            "exit_reasons": dict(collected.exit_reasons),
            "verification": dict(collected.verification),
        },
        "charts": collected.charts(stats),
        "shown": len(trajectories),
        "total": collected.total,
        "text_limit": TEXT_LIMIT,
        "trajectories": trajectories,
        "failed": failed,
        "failed_total": failed_total,
        "setup_failed": setup_failed,
        "setup_failed_total": setup_failed_total,
    }
    write_atomic(folder.path / FILE, lambda handle: handle.write(page(data)))
