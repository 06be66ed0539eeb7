"""Around each merge: the exports, fed every sample the merge writes to trajectories.jsonl, in its
order (so an export holds exactly its trajectories); then the dataset card and the report. A format
exported once is rewritten at every later merge (its file is in export/), so an export never disagrees
with trajectories.jsonl. Nothing here writes to trajectories.jsonl or statistics.json.
"""

from __future__ import annotations

from pathlib import Path

from trajforge import registry
from trajforge.export import card, report
from trajforge.export.formats import ExportRun
from trajforge.export.report import ReportData, write_report
from trajforge.journal.sample import Sample
from trajforge.runconfig import RunConfig
from trajforge.runfolder.folder import RunFolder, write_atomic
from trajforge.version import git_commit, project_version

EXPORT_DIR = "export"


def file_of(name: str) -> str:
    return registry.EXPORTS.entry(name).info["file"]


def formats_to_write(folder: RunFolder, asked: tuple[str, ...]) -> list[str]:
    """The formats asked now and those exported before (their file is there), in the registry's order."""
    every = registry.EXPORTS.names()
    there = {name for name in every if (folder.path / EXPORT_DIR / file_of(name)).exists()}
    return [name for name in every if name in asked or name in there]


class Exports:
    """Every format's file of one merge: `write` each sample written to trajectories.jsonl, then
    `commit` (or `abort`, and every file keeps what the last merge wrote)."""

    def __init__(self, folder: RunFolder, asked: tuple[str, ...], run_name: str):
        self.folder = folder
        self.formats = formats_to_write(folder, asked)
        self.run = ExportRun(self.formats, run_name, project_version())
        directory = folder.path / EXPORT_DIR
        if self.formats:
            directory.mkdir(exist_ok=True)
        self.kinds = {name: registry.EXPORTS[name] for name in self.formats}
        self.writers = {name: kind.writer(directory / file_of(name), self.run) for name, kind in self.kinds.items()}

    def write(self, sample: Sample) -> None:
        for name, writer in self.writers.items():
            writer.write(self.kinds[name].row(sample, self.run))

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()

    def commit(self) -> dict[str, str]:
        """Returns {format: path in the run folder}."""
        for writer in self.writers.values():
            writer.commit()
        return {name: f"{EXPORT_DIR}/{file_of(name)}" for name in self.formats}


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
