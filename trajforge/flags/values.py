"""How a flag's value is read: the parsers the flag table gives its flags, as Fire hands values over
(`a,b` as a tuple, a bare `--flag` as True, numbers as numbers or text) and as run.json keeps them.

Each parser is `(value, flag) -> the value the run uses` and raises FlagError with a message that names
the flag. Like the table, nothing here imports the package: the command line turns a FlagError into
its UsageError (exit 2, nothing sent)."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
TokenMode = Literal["off", "on", "required"]
TOKEN_MODES: tuple[TokenMode, ...] = ("off", "on", "required")
VERIFIER_FORM = "--verifier must be path/to/file.py:function or module:function"

Parser = Callable[[Any, str], Any]


class FlagError(ValueError):
    """A flag's value is wrong; the message names the flag and says what it takes."""


def text(value: Any, flag: str) -> str:
    return str(value)


def path(value: Any, flag: str) -> Path:
    return Path(str(value))


def url(value: Any) -> str:
    """An endpoint as run.json compares it: a trailing slash is the same endpoint."""
    return str(value).rstrip("/")


def names(value: Any, flag: str) -> list[str]:
    """Comma-separated names; Fire hands `a,b` over as a tuple, `a` as a str: accept either (and lists)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    out = [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    if not out:
        raise FlagError(f"--{flag} needs at least one name (comma separated)")
    return out


def folders(value: Any, flag: str) -> tuple[Path, ...]:
    """Existing folders, comma separated (or the flag repeated), resolved: a resume from elsewhere finds them."""
    try:
        found = tuple(Path(name).resolve() for name in names(value, flag))
    except RuntimeError as exc:  # Python 3.11's Path.resolve on a loop of links
        raise FlagError(f"--{flag}: {exc}") from None
    for folder in found:
        if not folder.is_dir():
            raise FlagError(f"--{flag}: {folder} is not a folder")
    return found


def folder_names(found: tuple[Path, ...]) -> list[str]:
    """Folders as run.json keeps them."""
    return [str(folder) for folder in found]


def boolean(value: Any, flag: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE or word in FALSE:
        return word in TRUE
    raise FlagError(f"--{flag} must be true or false, got {value!r}")


def whole(minimum: int) -> Parser:
    """A whole number of at least `minimum`."""

    def parse(value: Any, flag: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().lstrip("-").isdigit():
            raise FlagError(f"--{flag} must be a whole number, got {value!r}")
        number = int(value)
        if number < minimum:
            raise FlagError(f"--{flag} must be at least {minimum}, got {number}")
        return number

    return parse


def disk_size(value: Any, flag: str) -> int:
    """MB of a sample's disk: 0 for none, else room for the 1 MB a disk keeps aside for the verification."""
    number = whole(0)(value, flag)
    if number == 1:
        raise FlagError(f"--{flag} must be 0 (no bound) or at least 2: a sample's disk keeps 1 MB for its verification")
    return number


def number(value: Any, flag: str, what: str = "a number") -> float:
    try:
        found = float(value)
    except (TypeError, ValueError):
        found = math.nan
    if isinstance(value, bool) or not math.isfinite(found):  # a bare --flag comes as True
        raise FlagError(f"--{flag} must be {what}, got {value!r}")
    return found


MAX_SECONDS = 10_000_000  # about 116 days: more than any run, less than what a thread's wait can take


def seconds(value: Any, flag: str) -> float:
    found = number(value, flag, "a number of seconds")
    if not 0 < found <= MAX_SECONDS:
        raise FlagError(f"--{flag} must be more than 0 and at most {MAX_SECONDS} seconds, got {value!r}")
    return found


def amount(what: str = "an amount in USD", positive: bool = True) -> Parser:
    """A finite number: more than 0, or (a price) at least 0."""

    def parse(value: Any, flag: str) -> float:
        found = number(value, flag, what)
        if found < 0 or (positive and found == 0):
            raise FlagError(f"--{flag} must be {'more than' if positive else 'at least'} 0, got {value!r}")
        return found

    return parse


def one_of(allowed: Iterable[str]) -> Parser:
    choices = tuple(allowed)

    def parse(value: Any, flag: str) -> str:
        return choice(value, flag, choices)

    return parse


def registered(module: str, names: str) -> Parser:
    """One of the names a registry holds (backends, distributions), looked up when a value is read: the flag
    table imports nothing, and the plugins have registered theirs by then. `names`: a function of `module`."""

    def parse(value: Any, flag: str) -> str:
        return choice(value, flag, getattr(importlib.import_module(module), names)())

    return parse


def choice(value: Any, flag: str, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if str(value) not in allowed:
        raise FlagError(f"--{flag} must be one of {', '.join(allowed)}; got {value!r}")
    return str(value)


def reward_range(value: Any, flag: str) -> tuple[float, float]:
    """LOW,HIGH (Fire hands a comma-separated value over as a tuple; run.json keeps a list)."""
    parts = value.split(",") if isinstance(value, str) else value
    form = FlagError(f"--{flag} must be LOW,HIGH (two numbers, LOW <= HIGH), got {value!r}")
    if not isinstance(parts, list | tuple) or len(parts) != 2:
        raise form
    low, high = (number(part, flag, "LOW,HIGH (two numbers)") for part in parts)
    if low > high:
        raise form
    return low, high


def image(value: Any, flag: str) -> str:
    name = str(value).strip()
    if not name:
        raise FlagError(f"--{flag} must name an image, such as python:3.11-slim")
    return name


def run_name(value: Any, flag: str) -> str:
    name = str(value)
    if not name.strip() or "/" in name or name in (".", ".."):
        raise FlagError(f"--{flag} must be a plain folder name, got {name!r}")
    return name


def token_mode(value: Any, flag: str = "token_ids") -> TokenMode:
    """--token_ids as given (Fire: a bare flag is True): off, on or required."""
    if value is None or value is False:
        return "off"
    if value is True:
        return "on"
    word = str(value).strip().lower()
    word = {"true": "on", "yes": "on", "1": "on", "false": "off", "no": "off", "0": "off"}.get(word, word)
    if word not in TOKEN_MODES:
        raise FlagError(f"--{flag} must be true, false or required, got {value!r}")
    return word


def same_token_data(kept: TokenMode, now: TokenMode) -> bool:
    """Token ids shape the data (tokens.jsonl, the cache keys); on and required differ only in what a
    reply without them does, so a resume may switch between those two."""
    return (kept == "off") == (now == "off")


def verifier_spec(value: Any, flag: str) -> str:
    """path/to/file.py:function (the file made absolute: a resume or a worker may run from elsewhere) or
    module:function. Whether it loads is the verifier's own check."""
    if isinstance(value, bool) or not str(value).strip():
        raise FlagError(f"--{flag} needs path/to/file.py:function or module:function")
    target, sep, name = str(value).rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise FlagError(f"{VERIFIER_FORM}, got {str(value)!r}")
    if is_file_spec(target):
        return f"{Path(target).resolve()}:{name}"
    return f"{target}:{name}"


def sources(value: Any, flag: str) -> list[str]:
    """Comma-separated module names or files, the files made absolute (a resume may run from elsewhere)."""
    return [str(Path(name).resolve()) if is_file_spec(name) else name for name in names(value, flag)]


def files(value: Any, flag: str) -> list[str]:
    """Comma-separated files, made absolute."""
    return [str(Path(name).resolve()) for name in names(value, flag)]


def sources_kept(flag: str) -> Callable[[list[str]], list]:
    """What run.json keeps of `sources`: a module's name; a file's path and the digest of its content, so
    that a resume with a changed file is refused (a file's text shapes the data as a flag does)."""

    def keep(found: list[str]) -> list:
        return [{"path": name, "sha256": file_digest(name, flag)} if is_file_spec(name) else name for name in found]

    return keep


def sources_back(kept: list | None, flag: str) -> list[str] | None:
    return None if kept is None else [item["path"] if isinstance(item, dict) else item for item in kept]


def file_digest(path: str, flag: str) -> str:
    try:
        return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise FlagError(f"--{flag}: cannot read {path}: {exc.strerror or exc}") from None


def is_file_spec(target: str) -> bool:
    return target.endswith(".py") or "/" in target


def digest(value: Any) -> str:
    """A JSON value's fingerprint: run.json keeps this of a secret, never the text."""
    return "sha256:" + hashlib.sha256(json.dumps(value, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def secret_digest(value: str | None) -> str | None:
    return None if value is None else digest(value)


def must_come_again(kept: Any, flag: str) -> None:
    if kept is not None:  # only its digest was kept: the text itself must come again
        raise FlagError(f"--{flag}: this run was made with one ({kept}), which is never saved; pass the same again")


def prefill_path(value: Any, flag: str) -> str:
    """The prefill file, made absolute, after reading it once: a missing or malformed file stops here."""
    load_prefill(value)
    return str(Path(str(value)).resolve())


def prefill_kept(path: str | None) -> dict | None:
    """What run.json keeps of the prefill: where it was, and a digest of its messages, never the text."""
    return None if path is None else {"path": path, "sha256": digest(load_prefill(path))}


def prefill_back(kept: dict | None, flag: str) -> str | None:
    return None if kept is None else kept["path"]


def same_prefill(kept: dict | None, now: dict | None) -> bool:
    """The same messages from another path are the same run."""
    return (kept and kept["sha256"]) == (now and now["sha256"])


def load_prefill(path: Any) -> list[dict]:
    if path is None:
        return []
    try:
        messages = json.loads(Path(str(path)).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FlagError(f"--prefill_messages_file: {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FlagError(f"--prefill_messages_file: {path} is not valid JSON ({exc})") from None
    if not isinstance(messages, list):
        raise FlagError(f"--prefill_messages_file: {path} must hold a JSON list of {{role, content}} objects")
    for place, message in enumerate(messages, 1):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("system", "user", "assistant")
            or not isinstance(message.get("content"), str)
        ):
            raise FlagError(
                f"--prefill_messages_file: {path} message {place} needs a role (system, user or assistant) "
                "and a string content"
            )
    return messages


def rubric_path(value: Any, flag: str) -> str:
    """--judge's rubric file, made absolute, after reading it once: a missing or unreadable file stops here."""
    load_rubric(value)
    return str(Path(str(value)).resolve())


def rubric_kept(path: str | None) -> dict | None:
    """What run.json keeps of --judge: where the rubric was, and a digest of what it says."""
    return None if path is None else {"path": path, "sha256": digest(load_rubric(path))}


def rubric_back(kept: dict | None, flag: str) -> str | None:
    return None if kept is None else kept["path"]


def same_rubric(kept: dict | None, now: dict | None) -> bool:
    """The same rubric from another path is the same verification."""
    return (kept and kept["sha256"]) == (now and now["sha256"])


def load_rubric(path: Any) -> Any:
    """A rubric file's judge: its text (.md, .txt, ...), or a .json file's value (an object with `rubric`,
    `scale`, `judge_sees`), which verification checks as it checks a dataset's `judge`."""
    try:
        text = Path(str(path)).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FlagError(f"--judge: {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FlagError(f"--judge: {path} cannot be read as text ({exc})") from None
    if str(path).endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise FlagError(f"--judge: {path} is not valid JSON ({exc})") from None
    return text
