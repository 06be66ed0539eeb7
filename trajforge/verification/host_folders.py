"""A task's host folders (`workspace`, a directory-valued `tests`; a task folder of Harbor's format, whole):
where they may lie and how they are read.

A folder is named relative to the dataset file's folder (or absolute), and must lie, every symlink followed,
inside that folder or inside a --task_root folder: anything else is refused at load. It is read without
following any symlink below it (one is left out: it could point anywhere), and, when the runner is root and
the dataset file is not root's, by a short helper process (tree_reader.py) with the rights of the dataset
file's owner: no file that only root may read reaches a sandbox because the runner is root. A task folder
is read the same way, within itself, with the rights of its own owner (task_files).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trajforge.environments.shell import Executable
from trajforge.verification import tree_reader
from trajforge.verification.tree_reader import HEADER, Unreadable, inside, read_tree

READER_TIMEOUT = 600.0  # seconds for the helper to read one folder


@dataclass(frozen=True)
class Owner:
    """The rights a task's folders are read with: the dataset file owner's uid, gid and groups."""

    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def of(cls, uid: int, gid: int) -> Owner:
        try:
            user = pwd.getpwuid(uid)
        except KeyError:  # a uid without a name: its file's group and no other
            return cls(uid, gid, ())
        return cls(uid, user.pw_gid, tuple(os.getgrouplist(user.pw_name, user.pw_gid)))

    @classmethod
    def reading(cls, found: os.stat_result) -> Owner | None:
        """Whose rights what `found` describes (a dataset file, a task folder) is read with: its owner's when
        the runner is root and the owner is not; None, the runner's own, otherwise."""
        return cls.of(found.st_uid, found.st_gid) if os.geteuid() == 0 and found.st_uid != 0 else None


@dataclass(frozen=True)
class HostFolders:
    base: Path  # the dataset file's folder, resolved: a relative folder starts here
    roots: tuple[Path, ...]  # where a folder may lie, resolved: base, then each --task_root
    owner: Owner | None = None  # whose rights a root runner reads the folders with; None: the runner's own

    @classmethod
    def of(cls, dataset_file: Path, task_roots: Iterable[Path] = ()) -> HostFolders:
        """The folders of `dataset_file`'s tasks, as this process reads them. Where the file is not (a Ray node
        without the driver's files), no folder may be read: a task with one fails its setup, saying so."""
        base = dataset_file.resolve().parent
        try:
            found = dataset_file.stat()
        except FileNotFoundError:
            return cls(base, ())
        roots = tuple(dict.fromkeys([base, *(Path(root).resolve() for root in task_roots)]))
        return cls(base, roots, Owner.reading(found))

    def where(self, folder: str) -> Path:
        """`folder` (relative to the dataset file's folder, or absolute), every symlink followed."""
        return (self.base / folder).resolve()

    def problem(self, field: str, folder) -> str | None:
        """Why `folder` cannot be the entry's `field`, or None."""
        if not isinstance(folder, str) or not folder or "\0" in folder:
            return f'"{field}" must be a directory (relative to the dataset file)'
        try:
            where = self.where(folder)
        except RuntimeError:  # Python 3.11's Path.resolve on a loop of links
            return f'"{field}" {folder!r} is a link that loops (relative to the dataset file, {self.base})'
        if not inside(str(where), [str(root) for root in self.roots]):
            shown = "" if str(where) == folder else f" (that is {where})"
            places = " or ".join(str(root) for root in self.roots)
            return f'"{field}" {folder!r}{shown} lies outside {places}: pass --task_root=DIR for a folder elsewhere'
        if not where.is_dir():
            return f'"{field}" {folder!r} is not a directory (relative to the dataset file, {self.base})'
        return None

    def cwd_problem(self, workspace: str, cwd: str) -> str | None:
        """Why a relative `cwd` leaves the entry's `workspace` folder once its symlinks are followed, or None."""
        top = self.where(workspace)
        try:
            if os.path.isabs(cwd) or inside(str((top / cwd).resolve()), [str(top)]):
                return None
        except RuntimeError:  # a loop of links
            return f'"cwd" {cwd!r} is a link that loops in the workspace folder {top}'
        return f'"cwd" {cwd!r} leaves the workspace folder {top}, symlinks followed'

    def read(self, folder: str) -> dict[str, bytes]:
        """Every regular file under `folder`, by relative path, executables marked. Unreadable when it lies
        outside the roots by now, or when anything in it cannot be read with the rights it is read with."""
        where = str(self.base / folder)
        if self.owner is None:
            return _files(read_tree(where, self._roots))
        return _files(_records(self._helper([where], check=False)))

    def unreadable(self, folders: Iterable[str]) -> dict[str, str]:
        """Of `folders`, those the dataset file's owner cannot read whole, and why: one helper process for all
        of them. None to check when the runner reads with its own rights."""
        asked = {str(self.base / folder): folder for folder in folders}
        if self.owner is None or not asked:
            return {}
        found = json.loads(self._helper(list(asked), check=True))
        uid = self.owner.uid
        return {asked[where]: f"{why} (read as the dataset file's owner, uid {uid})" for where, why in found.items()}

    @property
    def _roots(self) -> list[str]:
        return [str(root) for root in self.roots]

    def _helper(self, folders: list[str], check: bool) -> bytes:
        """What the helper process wrote, having taken the owner's rights."""
        owner = self.owner
        assert owner is not None
        asked = {"uid": owner.uid, "gid": owner.gid, "groups": list(owner.groups), "roots": self._roots}
        request = json.dumps(asked | {"folders": folders, "check": check}).encode()
        argv = [sys.executable, "-I", "-S", tree_reader.__file__]
        try:
            done = subprocess.run(
                argv, input=request, capture_output=True, env={}, cwd="/", timeout=READER_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            raise Unreadable(f"{', '.join(folders)}: not read within {READER_TIMEOUT:g} s") from None
        if done.returncode:
            said = done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
            raise Unreadable(f"{said} (read as the dataset file's owner, uid {owner.uid})")
        return done.stdout


NO_FOLDERS = HostFolders(Path("/"), ())  # for tasks without a dataset file: a folder of theirs is never read


def task_files(folder: str | Path, sub: str = ".") -> dict[str, bytes]:
    """Every regular file of a task folder's `sub` (tests/, solution/, environment/; the whole folder by
    default), as read(): `sub` must lie inside the folder as it is opened, no symlink below it is followed,
    and a root runner reads with the rights of the folder's owner. `folder` is the path the load resolved:
    a link put in its place since (by the folder's owner) is not followed. Unreadable (an OSError) otherwise."""
    base = Path(folder)
    if (now := base.resolve()) != base:
        raise Unreadable(f"{folder} is {now} now: a task folder is read only where the load found it")
    return HostFolders(base, (base,), Owner.reading(base.stat())).read(sub)


def _files(records: Iterable[tuple[str, bool, bytes]]) -> dict[str, bytes]:
    """(path, executable, content) records as the files an environment writes, executables marked."""
    return {path: Executable(data) if executable else data for path, executable, data in records}


def _records(out: bytes) -> Iterator[tuple[str, bool, bytes]]:
    """The helper's records back."""
    at = 0
    while at < len(out):
        size, executable, length = HEADER.unpack_from(out, at)
        at += HEADER.size
        yield out[at : at + size].decode("utf-8", "surrogateescape"), executable, out[at + size : at + size + length]
        at += size + length
