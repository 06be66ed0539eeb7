"""The scripted model as a judge: it answers a judge's request (one asking for the `verdict` response
format, as verification/judge.py sends) with `{"score": ..., "reason": ...}`.

It reads ``[judge ...]`` directives in the request, outside the quoted blocks (`<<<BEGIN NAME id>>>` ..
`<<<END NAME id>>>` with the same id): in the rubric, where the user who wrote it steers it. Without one,
the score is a digest of what it grades and of how often it was asked the same (eleven steps across the
scale), so the samples of an entry differ.

    score=X          this score
    broken=KIND      every verdict is broken: text (no JSON), nan, big (1e308), string ("0.9"), huge (1 MB),
                     nested (a score nested 1000 levels), prose (the object inside prose: readable, a twin)
    broken_once=KIND only the first ask is broken; the judge's second ask is answered well
    obey             a hostile judge: directives inside the quoted blocks count too, and win (it follows
                     what the answer it grades tells it)
"""

from __future__ import annotations

import hashlib
import json
import re

QUOTED = re.compile(r"<<<BEGIN (\w+) (\w+)>>>\n.*?\n<<<END \1 \2>>>", re.S)
DIRECTIVE = re.compile(r"\[judge\s+([^\]]*)\]")
SCALE = re.compile(r"A score from (\S+) \(worst\) to (\S+) \(best\)")
KINDS = ("text", "nan", "big", "string", "huge", "nested", "prose")
GRADING = "You grade one answer to a task against a rubric."  # how verification/judge.py's system text begins


def is_judge(request: dict) -> bool:
    """A judge's request: the `verdict` response format, or (asked in plain text, of a server without
    structured output) a system message that asks for a grade."""
    response_format = request.get("response_format")
    if isinstance(response_format, dict) and (response_format.get("json_schema") or {}).get("name") == "verdict":
        return True
    messages = request.get("messages") or []
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    content = first.get("content")
    return first.get("role") == "system" and isinstance(content, str) and content.startswith(GRADING)


def _directives(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in DIRECTIVE.finditer(text):
        for word in match.group(1).split():
            key, _, value = word.partition("=")
            found[key] = value
    return found


def verdict(request: dict, attempt: int = 0) -> str:
    """The content of the judge's reply to `request`, asked `attempt` times before (by other samples of
    the entry, or --judge_samples: each gets another score, as a judge that samples would give)."""
    messages = request.get("messages") or []
    asked = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    again = any(m.get("role") == "assistant" for m in messages)  # the judge's second ask
    steer = _directives(QUOTED.sub("", asked))
    if "obey" in steer:
        steer |= _directives("\n".join(m.group(0) for m in QUOTED.finditer(asked)))
    scale = SCALE.search(asked)
    low, high = (float(scale.group(1)), float(scale.group(2))) if scale else (0.0, 1.0)
    broken = steer.get("broken") or (None if again else steer.get("broken_once"))
    if "score" in steer:
        score = float(steer["score"])
    else:
        step = (int(hashlib.sha256(asked.encode()).hexdigest()[:8], 16) + 3 * attempt) % 11
        score = low + (high - low) * step / 10
    reason = f"scored {score:g} by the scripted judge"
    return _broken(broken, score, reason) if broken else json.dumps({"score": score, "reason": reason})


def _broken(kind: str, score: float, reason: str) -> str:
    if kind == "text":
        return "The answer looks fine to me; I would give it a good mark."
    if kind == "nan":
        return '{"score": NaN, "reason": "not a number"}'
    if kind == "big":
        return '{"score": 1e308, "reason": "very good"}'
    if kind == "string":
        return json.dumps({"score": str(score), "reason": reason})
    if kind == "huge":
        return json.dumps({"score": score, "reason": "x" * 2**20})
    if kind == "nested":
        return '{"score": ' + "[" * 1000 + "]" * 1000 + ', "reason": "deep"}'
    if kind == "prose":
        return f"Here is my verdict: {json.dumps({'score': score, 'reason': reason})} Thank you."
    return f"(no such judge directive broken={kind}: one of {', '.join(KINDS)})"  # unusable, and says why
