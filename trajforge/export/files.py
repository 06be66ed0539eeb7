"""Export files written the way the run folder writes everything: to a temporary file beside the
target, fsynced, then renamed over it, so a kill never leaves a half-written export behind."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from trajforge.runfolder.folder import open_temp
from trajforge.safejson import dumps

Row = Callable[..., dict]


class AtomicFile:
    def __init__(self, path: Path):
        self.path = path
        fd, self.temp = open_temp(path)  # the run folder's file mode, not tempfile's 0600
        self.handle = os.fdopen(fd, "wb")

    def commit(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self.temp, self.path)

    def abort(self) -> None:
        self.handle.close()
        self.temp.unlink(missing_ok=True)


class JsonLines:
    """One JSON object per line."""

    def __init__(self, path: Path):
        self.out = AtomicFile(path)

    def write(self, row: dict) -> None:
        self.out.handle.write(dumps(row) + b"\n")

    def commit(self) -> None:
        self.out.commit()

    def abort(self) -> None:
        self.out.abort()


class JsonArray(JsonLines):
    """One JSON array, an element per line (what LLaMA-Factory's `file_name` reads), streamed."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.count = 0
        self.out.handle.write(b"[")

    def write(self, row: dict) -> None:
        self.out.handle.write((b",\n" if self.count else b"\n") + dumps(row))
        self.count += 1

    def commit(self) -> None:
        self.out.handle.write(b"\n]\n")
        super().commit()
