"""Around each merge: the exports, fed every sample the merge writes to trajectories.jsonl, in its
order (so an export holds exactly its trajectories); then the dataset card and the report. A format
exported once is rewritten at every later merge (its file is in export/), so an export never disagrees
with trajectories.jsonl. Nothing here writes to trajectories.jsonl or statistics.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from trajforge.export import FILES, FORMATS, atif, card, llamafactory, openai, report, rl
from trajforge.export.files import JsonArray, JsonLines
from trajforge.export.report import ReportData, write_report
from trajforge.journal.sample import Sample
from trajforge.runconfig import RunConfig
from trajforge.runfolder.folder import RunFolder, write_atomic
from trajforge.version import git_commit, project_version

EXPORT_DIR = "export"


def _writer(name: str, path: Path, formats: list[str]):
    if name == "rl":  # from the token ids each sample was journalled with
        return rl.RlFile(path, parquet="parquet" in formats)
    if name == "parquet":
        from trajforge.export.parquet import ParquetFile  # pyarrow only when asked: a second to import

        return ParquetFile(path)
    return (JsonArray if name == "llamafactory" else JsonLines)(path)


def _row(name: str, sample: Sample, version: str):
    """What the writer of format `name` takes for one sample."""
    if name in ("parquet", "rl"):
        return sample  # its writer maps the sample onto its schema
    if name == "atif":
        return atif.row(sample, version)
    return (openai if name == "openai" else llamafactory).row(sample)


def formats_to_write(folder: RunFolder, asked: tuple[str, ...]) -> list[str]:
    """The formats asked now and those exported before (their file is there), in FORMATS order."""
    there = {name for name in FORMATS if (folder.path / EXPORT_DIR / FILES[name]).exists()}
    return [name for name in FORMATS if name in asked or name in there]


class Exports:
    """Every format's file of one merge: `write` each sample written to trajectories.jsonl, then
    `commit` (or `abort`, and every file keeps what the last merge wrote)."""

    def __init__(self, folder: RunFolder, asked: tuple[str, ...], run_name: str):
        self.folder, self.run_name, self.version = folder, run_name, project_version()
        self.formats = formats_to_write(folder, asked)
        directory = folder.path / EXPORT_DIR
        if self.formats:
            directory.mkdir(exist_ok=True)
        self.writers = {name: _writer(name, directory / FILES[name], self.formats) for name in self.formats}

    def write(self, sample: Sample) -> None:
        for name, writer in self.writers.items():
            writer.write(_row(name, sample, self.version))

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()

    def commit(self) -> dict[str, str]:
        """Returns {format: path in the run folder}."""
        for writer in self.writers.values():
            writer.commit()
        if "llamafactory" in self.formats:
            info = json.dumps(llamafactory.dataset_info(self.run_name), indent=2).encode()
            directory = self.folder.path / EXPORT_DIR
            write_atomic(directory / llamafactory.INFO_FILE, lambda handle: handle.write(info + b"\n"))
        return {name: f"{EXPORT_DIR}/{FILES[name]}" for name in self.formats}


def publish(
    folder: RunFolder,
    stats: dict,
    config: RunConfig,
    collected: ReportData | None,
    settled: set[str],
    exports: dict[str, str],
) -> dict[str, Path]:
    """Write the card and (unless --report=false) the report, beside the `exports` the merge wrote
    (Exports.commit); returns what to tell the user."""
    text = card.render(stats, card.shaping_flags(config), exports, project_version(), git_commit())
    write_atomic(folder.path / card.FILE, lambda handle: handle.write(text.encode()))
    written = {"Dataset card": folder.path / card.FILE}
    if exports:
        written["Exports"] = folder.path / EXPORT_DIR
    if collected is not None:
        write_report(folder, stats, collected, settled)
        written["Report"] = folder.path / report.FILE
    return written
