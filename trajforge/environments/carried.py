"""The agent's work folder as it is carried into a fresh container (DockerEnvironment.fresh_copy): the
engine's tar of it, filtered here, on the host. No link is resolved in the container the agent had: there
/tests or /etc may be the agent's own symlink, so `readlink -f` would call a link into the real /tests of
the fresh container internal. Each link is resolved through the archive's own links, as the fresh
container will see it, and kept only when it stays inside the work folder.

Kept: directories, regular files, symlinks that stay inside, hardlinks to a regular file kept. Dropped,
each named: symlinks that are absolute or climb out, hardlinks to anything else, FIFOs, devices.

The tars pass through files (in memory up to SPOOL bytes, on disk beyond), never whole in memory: a work
folder near the carried bound costs the worker SPOOL bytes, not twice its size."""

from __future__ import annotations

import posixpath
import tarfile
import tempfile
from collections.abc import Iterable
from typing import IO

MAX_HOPS = 40  # links followed in one resolution (the kernel's ELOOP limit)
SPOOL = 8 << 20  # bytes of a tar kept in memory before it goes to a temporary file


def spooled() -> IO[bytes]:
    return tempfile.SpooledTemporaryFile(SPOOL)


def gathered(chunks: Iterable[bytes], limit: int) -> IO[bytes]:
    """The archive the engine streams, in a spooled file read from its start; OSError past `limit` bytes."""
    archive, size = spooled(), 0
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            archive.close()
            raise OSError(f"the working directory holds more than {limit >> 20} MB: it is not carried over")
        archive.write(chunk)
    archive.seek(0)
    return archive


def _parts(text: str) -> list[str]:
    return [part for part in text.split("/") if part not in ("", ".")]


def stays_inside(links: dict[str, str], directory: str, target: str) -> bool:
    """Whether the link text `target`, in `directory` (a path below the work folder, "" for it), resolves
    inside the work folder; `links` holds every symlink of the archive (path below it -> its text)."""
    if target.startswith("/"):
        return False
    path, pending, hops = _parts(directory), _parts(target), 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if not path:
                return False
            path.pop()
            continue
        path.append(part)
        text = links.get("/".join(path))
        if text is not None:
            hops += 1
            if hops > MAX_HOPS or text.startswith("/"):
                return False
            path.pop()
            pending = _parts(text) + pending
    return True


def carried(archive: IO[bytes], root: str) -> tuple[IO[bytes], list[str]]:
    """(the tar of the work folder `root` (its top directory's name in `archive`) with only what may be
    carried, as a spooled file read from its start; the paths dropped, relative to the work folder)."""
    with tarfile.open(fileobj=archive, mode="r:") as source:
        members = source.getmembers()

        def below(name: str) -> str | None:
            """The member's path below the work folder ("" for the folder itself), None outside it."""
            name = name.rstrip("/")
            if name == root:
                return ""
            return name[len(root) + 1 :] if name.startswith(root + "/") and ".." not in name.split("/") else None

        links = {path: member.linkname for member in members if member.issym() and (path := below(member.name))}
        buffer, dropped, kept_files = spooled(), [], set()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
            for member in members:
                path = below(member.name)
                if path is None:
                    dropped.append(member.name)
                    continue
                if member.isdir() or member.isreg():
                    keep = True
                elif member.issym():
                    keep = bool(path) and stays_inside(links, posixpath.dirname(path), member.linkname)
                elif member.islnk():
                    keep = below(member.linkname) in kept_files
                else:  # FIFOs, character and block devices
                    keep = False
                if not keep:
                    dropped.append(path or root)
                    continue
                if member.isreg():
                    kept_files.add(path)
                # Writable by its owner: a verify command without capabilities must not fail to write its own
                # files over ones the agent made read-only (and then compare what the agent left there).
                member.mode |= 0o700 if member.isdir() else 0o600 if member.isreg() else 0
                out.addfile(member, source.extractfile(member) if member.isreg() else None)
    buffer.seek(0)
    return buffer, dropped
