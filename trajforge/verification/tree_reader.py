"""Every regular file under a task's folder, read without following a symlink, with the rights of the process
that reads it. Imported, it reads in this process. Run as a script (`python3 -I -S tree_reader.py`) by a root
runner, it reads its request from stdin (JSON: uid, gid, groups, roots, folders, check), takes that uid, gid
and supplementary groups, then either reads the one folder and writes one record a file to stdout (a header:
path length, executable, content length; the path; the content), or, with `check`, opens every file of every
folder without reading it and writes {folder: why} for those it cannot read whole. It imports nothing of the
package (the fresh interpreter that runs it has no site-packages): host_folders.py starts it.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import sys
from collections.abc import Iterator, Sequence

HEADER = struct.Struct("<I?Q")  # path length, executable, content length
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Unreadable(OSError):
    """The folder lies outside every root once opened, or a file or folder in it cannot be read."""


def _raise(error: OSError) -> None:
    raise Unreadable(f"{error.filename or 'a folder'}: {error.strerror}")


def inside(path: str, roots: Sequence[str]) -> bool:
    return any(os.path.commonpath([root, path]) == root for root in roots)


def _file(name: str, folder_fd: int, content: bool) -> tuple[bool, bytes] | None:
    """A regular file's (executable, content, or b"" when not asked); None for anything else (a symlink, a
    FIFO, a device)."""
    if not stat.S_ISREG(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode):
        return None
    fd = os.open(name, FILE_FLAGS, dir_fd=folder_fd)  # O_NOFOLLOW: swapped for a symlink meanwhile, it fails
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        return (bool(mode & 0o111), handle.read() if content else b"") if stat.S_ISREG(mode) else None


def read_tree(folder: str, roots: Sequence[str], content: bool = True) -> Iterator[tuple[str, bool, bytes]]:
    """(relative path, executable, content) of every regular file under `folder`, in order (each opened, but
    its content left unread, b"", without `content`). The folder must lie inside one of `roots` (resolved
    paths) as it is opened; symlinks below it are left out, neither read nor walked into. Unreadable when the
    folder or anything under it cannot be read."""
    try:
        top = os.open(folder, FOLDER_FLAGS)
    except OSError as exc:
        raise Unreadable(f"{folder}: {exc.strerror}") from None
    try:
        real = os.readlink(f"/proc/self/fd/{top}")
        if not inside(real, roots):
            raise Unreadable(f"{folder} is {real}, outside {', '.join(roots) or 'every folder a task may use here'}")
        walk = os.fwalk(".", dir_fd=top, follow_symlinks=False, onerror=_raise)
        while True:
            try:  # fwalk recurses once per folder level (Python 3.11): a tree ~1,000 deep is too deep for it
                path, dirs, names, folder_fd = next(walk)
            except StopIteration:
                break
            except RecursionError:
                raise Unreadable(f"{folder}: its folders lie too deep to be read") from None
            dirs.sort()
            for name in sorted(names):
                try:
                    found = _file(name, folder_fd, content)
                except OSError as exc:
                    raise Unreadable(f"{os.path.normpath(os.path.join(folder, path, name))}: {exc.strerror}") from None
                if found is not None:
                    yield os.path.normpath(os.path.join(path, name)), *found
    finally:
        os.close(top)


def unreadable(folders: Sequence[str], roots: Sequence[str]) -> dict[str, str]:
    """Of `folders`, those that cannot be read whole, and why."""
    found = {}
    for folder in folders:
        try:
            for _ in read_tree(folder, roots, content=False):
                pass
        except Unreadable as exc:
            found[folder] = str(exc)
    return found


def main() -> int:
    asked = json.loads(sys.stdin.buffer.read())
    os.setgroups(asked["groups"])
    os.setresgid(asked["gid"], asked["gid"], asked["gid"])
    os.setresuid(asked["uid"], asked["uid"], asked["uid"])
    out = sys.stdout.buffer
    if asked["check"]:
        out.write(json.dumps(unreadable(asked["folders"], asked["roots"])).encode())
        return 0
    try:
        (folder,) = asked["folders"]
        for path, executable, data in read_tree(folder, asked["roots"]):
            name = path.encode("utf-8", "surrogateescape")
            out.write(HEADER.pack(len(name), executable, len(data)) + name)
            out.write(data)
    except Unreadable as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
