"""After each merge: the exports, the dataset card and the report, from what the merge wrote.

Exports read trajectories.jsonl itself, so they hold exactly its trajectories; a format exported once
is rewritten at every later merge (its file is in export/), so an export never disagrees with
trajectories.jsonl. Nothing here writes to trajectories.jsonl or statistics.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson

from trajforge.export import FILES, FORMATS, atif, card, llamafactory, openai, report, rl
from trajforge.export.files import JsonArray, JsonLines
from trajforge.export.record import Conversation, parse
from trajforge.export.report import ReportData, write_report
from trajforge.runconfig import RunConfig
from trajforge.runfolder.folder import RunFolder, write_atomic
from trajforge.version import git_commit, project_version

EXPORT_DIR = "export"


def _writer(name: str, path: Path, folder: RunFolder, formats: list[str]):
    if name == "rl":  # from tokens.jsonl, read beside trajectories.jsonl
        return rl.RlFile(path, folder.tokens, parquet="parquet" in formats)
    if name == "parquet":
        from trajforge.export.parquet import ParquetFile  # pyarrow only when asked: a second to import

        return ParquetFile(path)
    return (JsonArray if name == "llamafactory" else JsonLines)(path)


RAW = ("parquet", "rl")  # the formats whose writer maps the record itself: no parsed Conversation


def _row(name: str, conversation: Conversation | None, record: dict, version: str):
    """What the writer of format `name` takes for one record."""
    if name in RAW:
        return record  # its writer maps the record onto its schema
    assert conversation is not None  # read for every format but the RAW ones
    if name == "atif":
        return atif.row(conversation, record, version)
    return (openai if name == "openai" else llamafactory).row(conversation, record)


def formats_to_write(folder: RunFolder, asked: tuple[str, ...]) -> list[str]:
    """The formats asked now and those exported before (their file is there), in FORMATS order."""
    there = {name for name in FORMATS if (folder.path / EXPORT_DIR / FILES[name]).exists()}
    return [name for name in FORMATS if name in asked or name in there]


def write_exports(folder: RunFolder, formats: list[str], run_name: str, version: str) -> dict[str, str]:
    """Every format in one pass over trajectories.jsonl; returns {format: path in the run folder}."""
    if not formats:
        return {}
    directory = folder.path / EXPORT_DIR
    directory.mkdir(exist_ok=True)
    writers = {name: _writer(name, directory / FILES[name], folder, formats) for name in formats}
    needs_parse = any(name not in RAW for name in formats)
    try:
        with open(folder.trajectories, "rb") as lines:
            for line in lines:
                if not line.strip():
                    continue
                record = orjson.loads(line)
                conversation = parse(record) if needs_parse else None
                for name, writer in writers.items():
                    writer.write(_row(name, conversation, record, version))
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    for writer in writers.values():
        writer.commit()
    if "llamafactory" in formats:
        info = json.dumps(llamafactory.dataset_info(run_name), indent=2).encode()
        write_atomic(directory / llamafactory.INFO_FILE, lambda handle: handle.write(info + b"\n"))
    return {name: f"{EXPORT_DIR}/{FILES[name]}" for name in formats}


def publish(
    folder: RunFolder, stats: dict, config: RunConfig, collected: ReportData | None, settled: set[str]
) -> dict[str, Path]:
    """Write the exports, the card and (unless --report=false) the report; returns what to tell the user."""
    version = project_version()
    exports = write_exports(folder, formats_to_write(folder, config.exports), config.run_name, version)
    text = card.render(stats, card.shaping_flags(config), exports, version, git_commit())
    write_atomic(folder.path / card.FILE, lambda handle: handle.write(text.encode()))
    written = {"Dataset card": folder.path / card.FILE}
    if exports:
        written["Exports"] = folder.path / EXPORT_DIR
    if collected is not None:
        write_report(folder, stats, collected, settled)
        written["Report"] = folder.path / report.FILE
    return written
