"""Task folders in Harbor's format (Terminal-Bench 2 and its adapters) as dataset entries.

`--dataset_file=DIR`: DIR is a task folder (it holds task.toml) or holds task folders up to six levels
down (hidden folders skipped; a task folder's own sub-folders are not searched). Each becomes one entry:

    {"prompt": instruction.md (leading canary lines dropped), "docker_image": what the agent's container
     runs, "harbor": {"name", "folder", "task_toml", "digest", "settings"}}

`digest` is what --resume matches (runfolder/folder.py: entry_key): the folder's files without tests/ and
solution/, so fixing a test pays for nothing again. `settings` is FolderSettings (environments/
folder_task.py). A folder that cannot be used stops the run at load, named, before any request.

Every file of a task folder is read as verification/host_folders.py reads a dataset's folders: only its
regular files, no symlink followed, and by a root runner with the rights of the folder's owner.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tomllib
from dataclasses import asdict, replace
from pathlib import Path

from trajforge.environments import AUTO, EnvironmentSettings, backend_class, choose
from trajforge.environments.dockerfile import fetch_problem
from trajforge.environments.folder_task import IMAGE_PREFIX, KEY, FolderSettings
from trajforge.environments.shell import Executable, tar_archive
from trajforge.environments.trees import below
from trajforge.errors import SetupError, UsageError
from trajforge.run.dataset import MAX_LISTED, Entry, load_dataset
from trajforge.runconfig import RunConfig
from trajforge.verification.host_folders import task_files

MAX_LEVELS = 6
MAX_INSTRUCTION = 1_000_000  # bytes
HIDDEN = ("tests", "solution")  # left out of the digest: the agent never sees them
COMPOSE = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
UNITS = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
CANARY = re.compile(r"^\s*(<!--.*canary.*-->|#.*canary.*)\s*$", re.IGNORECASE)


def find_tasks(root: Path) -> list[Path]:
    """Task folders under `root` (itself, when it holds task.toml), in path order."""
    if (root / "task.toml").exists():
        return [root]
    found: list[Path] = []
    for folder, dirs, _ in os.walk(root):
        here = Path(folder)
        level = len(here.relative_to(root).parts)
        if level and (here / "task.toml").exists():
            found.append(here)
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (here / d).is_symlink())
        if level >= MAX_LEVELS:
            dirs[:] = []
    return sorted(found)


def regular(files: dict[str, bytes], name: str) -> bytes:
    """The task folder's file `name` (of task_files); ValueError when it is none or no regular file."""
    if name not in files:
        raise ValueError(f"has no {name} (a regular file: a link is not followed)")
    return files[name]


def prompt_of(text: str) -> str:
    """instruction.md without its leading canary lines (an HTML comment or '#' line naming a canary)."""
    lines = text.splitlines(keepends=True)
    while lines and (CANARY.match(lines[0]) or (not lines[0].strip() and len(lines) > 1)):
        lines.pop(0)
    return "".join(lines)


def escapes(folder: Path, sub: str) -> str | None:
    """A symlink under folder/sub that resolves outside the task folder, named; or None. ValueError when a
    folder under it cannot be listed."""
    root, top = folder.resolve(), folder / sub
    if top.is_symlink() and not _inside(top, root):
        return sub
    if not top.is_dir():
        return None
    try:
        for entry in below(str(top)):  # as deep as the tree goes (os.walk's RecursionError ~1,000 deep)
            if entry.is_symlink() and not _inside(Path(entry.path), root):
                return str(Path(entry.path).relative_to(folder))
    except OSError as exc:  # a path longer than PATH_MAX among them
        raise ValueError(f"{sub}: a folder in it cannot be read ({exc.strerror})") from None
    return None


def _inside(path: Path, root: Path) -> bool:
    """Whether the link `path` resolves inside `root`; a loop of links (RuntimeError) resolves nowhere."""
    try:
        return path.resolve().is_relative_to(root)
    except (RuntimeError, OSError):
        return False


def folder_digest(files: dict[str, bytes]) -> str:
    """What --resume matches a task by: every file of the folder (task_files) but tests/ and solution/
    (path, whether executable, content)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        if name.split("/", 1)[0] in HIDDEN:
            continue
        data = files[name]
        kind = b"exec" if isinstance(data, Executable) else b"file"
        for part in (name.encode("utf-8", "surrogateescape"), kind, len(data).to_bytes(8, "big"), data):
            digest.update(part)
    return digest.hexdigest()


def build_context(files: dict[str, bytes]) -> bytes:
    """environment/'s files (task_files) as the tar the engine builds from: sorted, each 0644 or 0755, owned
    by root, no times, so that its digest names its content."""
    return tar_archive(dict(sorted(files.items())))


def environment_of(files: dict[str, bytes]) -> dict[str, bytes]:
    """environment/'s files (paths relative to it) out of the task folder's."""
    return {name.removeprefix("environment/"): data for name, data in files.items() if name.startswith("environment/")}


def as_text(data: bytes, errors: str = "strict") -> str:
    """A task folder's file as text, its line ends made "\n" (as Python's text files read them)."""
    return data.decode("utf-8", errors).replace("\r\n", "\n").replace("\r", "\n")


def image_tag(name: str, context: bytes) -> str:
    safe = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip(".-_") or "task"
    return f"{IMAGE_PREFIX}{safe[:100]}:{hashlib.sha256(context).hexdigest()[:20]}"


def megabytes(value, key: str) -> float:
    """A size of task.toml in MB: a number (of MB) or a text such as "4G", "512M", "2048"."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{key} must be a number of MB or a size such as '4G'")
    if isinstance(value, str):
        found = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", value, re.IGNORECASE)
        if not found:
            raise ValueError(f"{key} = {value!r} is not a size such as '4G' or '512M'")
        value = float(found[1]) * UNITS[found[2].upper()]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{key} must be more than 0")
    return float(value)


def _seconds(table: dict, section: str, key: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"[{section}] {key} must be a number of seconds more than 0")
    return float(value)


def _table(toml: dict, section: str) -> dict:
    value = toml.get(section, {})
    if not isinstance(value, dict):
        raise ValueError(f"[{section}] must be a table")
    return value


def _lower(file_value: float | None, flag_value: float) -> float:
    """The lower of two limits, where 0 (or None) is no limit."""
    limits = [value for value in (file_value, flag_value) if value]
    return min(limits) if limits else 0


def settings_of(toml: dict, config: RunConfig, notes: set[str]) -> tuple[FolderSettings, str | None]:
    """The task's settings as this run resolves them, and its docker_image (None: built from
    environment/). `notes` collects the flags that won over a task.toml value, and the file's times cut to a
    flag's default (each the lower of the two: a task folder's time never loosens the runner's)."""
    agent, verifier, environment = (_table(toml, name) for name in ("agent", "verifier", "environment"))
    timeouts = {}
    for field, section, table, key, flag, value in (
        ("agent_timeout", "agent", agent, "timeout_sec", "prompt_timeout", config.prompt_timeout),
        ("verify_timeout", "verifier", verifier, "timeout_sec", "verify_timeout", config.verify.timeout),
        ("build_timeout", "environment", environment, "build_timeout_sec", "setup_timeout", config.setup_timeout),
    ):
        in_file = _seconds(table, section, key)
        if in_file is not None and flag in config.given:
            notes.add(f"--{flag} (given) wins over task.toml's [{section}] {key}")
        elif in_file is not None and in_file > value:  # the file's time never loosens the flag's default
            notes.add(f"task.toml's [{section}] {key} above --{flag} ({value:g} s) cut to it; pass --{flag} for more")
        timeouts[field] = value if in_file is None or flag in config.given else min(in_file, value)
    env = verifier.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError("[verifier] env must be a table of names to text")
    image = environment.get("docker_image")
    if image is not None and not (isinstance(image, str) and image.strip()):
        raise ValueError("[environment] docker_image must be a non-empty image name")
    cpus = environment.get("cpus")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float) or not cpus > 0):
        raise ValueError("[environment] cpus must be a number more than 0")
    memory = environment.get("memory_mb", environment.get("memory"))
    memory_mb = megabytes(memory, "[environment] memory") if memory is not None else None
    storage = environment.get("storage_mb", environment.get("storage"))
    if storage is not None:
        megabytes(storage, "[environment] storage")
        notes.add("[environment] storage is not enforced (the engine's overlay2 storage driver has no size quota)")
    internet = environment.get("allow_internet", False)
    if not isinstance(internet, bool):
        raise ValueError("[environment] allow_internet must be true or false")
    limits = config.environment.limits
    settings = FolderSettings(
        **timeouts,
        cpus=float(min(cpus, os.cpu_count() or 1)) if cpus else 0.0,
        memory_mb=int(_lower(memory_mb, limits.max_memory_mb)),
        network=internet and config.environment.sandbox_network,
        verifier_env=dict(env),
        build=image is None,
    )
    return settings, image


def read_task(folder: Path, config: RunConfig, notes: set[str]) -> dict:
    """The entry of one task folder; ValueError saying why it cannot be used."""
    files = task_files(folder.resolve())  # Unreadable (an OSError) when its owner cannot read it all
    try:
        text = as_text(regular(files, "task.toml"))
        toml = tomllib.loads(text)
    except ValueError as exc:  # also UnicodeDecodeError, TOMLDecodeError
        raise ValueError(f"task.toml cannot be read: {exc}") from None
    instruction = regular(files, "instruction.md")
    if len(instruction) > MAX_INSTRUCTION:
        raise ValueError(f"instruction.md is {len(instruction)} bytes, more than {MAX_INSTRUCTION}")
    try:
        prompt = prompt_of(as_text(instruction))
    except UnicodeDecodeError as exc:
        raise ValueError(f"instruction.md is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not prompt.strip():
        raise ValueError("instruction.md has no instruction (only canary lines or blanks)")
    for sub in ("environment", "tests", "solution"):
        if left := escapes(folder, sub):
            raise ValueError(f"{left} is a link that leaves the task folder (or loops)")
    regular(files, "tests/test.sh")
    if found := [name for name in COMPOSE if (folder / "environment" / name).exists()]:
        raise ValueError(f"environment/{found[0]}: docker-compose environments are not supported; use one Dockerfile")
    settings, image = settings_of(toml, config, notes)
    if image is None:
        if "environment/Dockerfile" not in files:
            raise ValueError("has neither environment/Dockerfile nor [environment] docker_image")
        if problem := fetch_problem(as_text(files["environment/Dockerfile"], "replace")):
            raise ValueError(problem)
        image = image_tag(folder.name, build_context(environment_of(files)))
    task = {"name": folder.name, "folder": str(folder.resolve()), "task_toml": text, "digest": folder_digest(files)}
    return {"prompt": prompt, "docker_image": image, KEY: task | {"settings": asdict(settings)}}


def load_folders(config: RunConfig) -> tuple[list[Entry], list[str]]:
    """The entries of the task folders under --dataset_file (the first --max_samples), and the notes to
    print once (a flag that won over task.toml, a limit not enforced); UsageError naming each bad folder."""
    root = Path(config.dataset_file)
    for flag, given in (("verifier", config.verify.verifier), ("judge", config.verify.judge)):
        if given:  # it would be left unused without a word: each folder's tests/test.sh verifies it
            raise UsageError(f"--{flag} does not apply to task folders: each is verified by its tests/test.sh")
    folders = find_tasks(root)
    if config.max_samples is not None:
        folders = folders[: config.max_samples]
    if not folders:
        raise UsageError(f"--dataset_file: {root} holds no task folder (a folder with a task.toml)")
    entries: list[Entry] = []
    bad: list[str] = []
    notes: set[str] = set()
    seen: dict[str, Path] = {}
    for folder in folders:
        if folder.name in seen:
            bad.append(f"{folder}: the task name {folder.name!r} is also {seen[folder.name]}")
            continue
        seen[folder.name] = folder
        try:
            entries.append(Entry(len(entries), read_task(folder, config, notes)))
        except (ValueError, OSError) as exc:
            bad.append(f"{folder}: {exc}")
    if bad:
        raise refused(bad)
    return entries, sorted(notes)


def refused(bad: list[str]) -> UsageError:
    """The load's error for the task folders in `bad` (each "folder: why")."""
    shown = "\n  ".join(bad[:MAX_LISTED])
    more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
    return UsageError(f"--dataset_file: {len(bad)} task folder(s) cannot be used; nothing was sent:\n  {shown}{more}")


def load_entries(config: RunConfig) -> tuple[list[Entry], list[str]]:
    """--dataset_file's entries: task folders when it is a folder, else the JSONL file's lines; and the
    notes to print once."""
    if Path(config.dataset_file).is_dir():
        return load_folders(config)
    return load_dataset(config.dataset_file, config.max_samples, config.task_root or ()), []


def environment_for(settings: EnvironmentSettings, entries: list[Entry]) -> tuple[EnvironmentSettings, str | None]:
    """The run's environment settings with --environment=auto made concrete (docker for task folders),
    and the warning to print once; UsageError when task folders cannot run here, naming them."""
    tasks = [entry.data[KEY]["name"] for entry in entries if KEY in entry.data]
    if not tasks:
        return choose(settings)
    named = ", ".join(tasks[:MAX_LISTED]) + (f" and {len(tasks) - MAX_LISTED} more" if len(tasks) > MAX_LISTED else "")
    if settings.kind not in (AUTO, "docker"):
        raise UsageError(
            f"--environment={settings.kind}: task folders run in Docker ({named}); pass --environment=docker"
        )
    settings = replace(settings, kind="docker")
    try:
        backend_class("docker").check(settings)
    except SetupError as exc:
        raise UsageError(f"{len(tasks)} task folder(s) need a Docker engine ({named}): {exc}") from None
    if absent := absent_images(entries):
        raise refused(absent)
    return settings, None


def absent_images(entries: list[Entry]) -> list[str]:
    """The task folders whose [environment] docker_image is not on the Docker engine, each with why: the
    runner pulls none (the engine would fetch it from wherever its name points, the host's loopback too)."""
    named = {entry.data["docker_image"]: entry.data[KEY]["folder"] for entry in entries if _named_image(entry)}
    if not named:
        return []
    from trajforge.environments.docker import connect  # the Docker SDK: loaded by runs with task folders only
    from trajforge.environments.docker_build import image_present

    client = connect()
    try:
        return [
            f"{folder}: [environment] docker_image {image!r} is not on the Docker engine, and the runner pulls no "
            f"image a task folder names (the engine would fetch it from wherever the name points): docker pull it"
            for image, folder in named.items()
            if not image_present(client, image)
        ]
    finally:
        client.close()


def _named_image(entry: Entry) -> bool:
    settings = FolderSettings.of(entry.data)
    return settings is not None and not settings.build
