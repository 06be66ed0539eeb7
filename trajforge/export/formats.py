"""The built-in export formats as the registry holds them (trajforge/builtin.py registers them by name):
each an Export, `writer(path, run)` opening its file and `row(sample, run)` what it writes for one sample.
A plugin's format is the same two functions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trajforge.export import atif, llamafactory, openai, rl
from trajforge.export.files import JsonArray, JsonLines
from trajforge.journal.sample import Sample
from trajforge.registry import Export
from trajforge.runfolder.folder import write_atomic


@dataclass(frozen=True)
class ExportRun:
    """What every format of one merge knows: the formats written together, the run, the runner's version."""

    formats: list[str]
    run_name: str
    version: str


class LlamaFactoryFile(JsonArray):
    """The array of rows, and dataset_info.json beside it, which names the run's dataset."""

    def __init__(self, path: Path, run: ExportRun):
        super().__init__(path)
        self.info = path.parent / llamafactory.INFO_FILE
        self.run_name = run.run_name

    def commit(self) -> None:
        super().commit()
        info = json.dumps(llamafactory.dataset_info(self.run_name), indent=2).encode()
        write_atomic(self.info, lambda handle: handle.write(info + b"\n"))


def _parquet(path: Path, run: ExportRun):
    from trajforge.export.parquet import ParquetFile  # pyarrow only when asked: a second to import

    return ParquetFile(path)


def _itself(sample: Sample, run: ExportRun) -> Sample:
    return sample  # its writer maps the sample onto its schema


OPENAI = Export(lambda path, run: JsonLines(path), lambda sample, run: openai.row(sample))
LLAMAFACTORY = Export(LlamaFactoryFile, lambda sample, run: llamafactory.row(sample))
ATIF = Export(lambda path, run: JsonLines(path), lambda sample, run: atif.row(sample, run.version))
PARQUET = Export(_parquet, _itself)
RL = Export(lambda path, run: rl.RlFile(path, parquet="parquet" in run.formats), _itself)  # from the token ids
