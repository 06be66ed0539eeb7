"""A command in a container, over the docker SDK's connection to the engine: an exec started attached
(exec_stream), its multiplexed output read from the buffer the reply's headers were parsed from (frames),
and a long-running one with pipes as asyncio's processes have (ContainerProcess: a stdio MCP server),
with the host files it reads put into the container first (readable_archive)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import struct
import tarfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import docker
import requests

from trajforge.environments.limits import MB

FRAME_HEADER, STDERR = struct.Struct(">BxxxL"), 2  # a frame of an exec's output: stream number, length
NOBODY = 65534  # owns what readable_archive puts in a container: not the agent's uid, root's included
IN_FLIGHT = 4  # frames of a process's output handed to the event loop and not yet taken in
# Seconds a paused reader may take nothing before its process's connection is shut: nobody reads it (its MCP
# connection ended). The engine must never be left blocked on output no one reads: Docker 20.10 then hangs
# every later exec of the container once that process exits, the agent's commands and their kill included.
ABANDONED = 30.0


def exec_stream(api: docker.APIClient, exec_id: str) -> requests.Response:
    """Start an exec attached to its output (and its input, when it was created with stdin), as the SDK's
    exec_start does, and hand back the response whose buffered reader holds the output. The SDK reads the
    socket beneath that buffer, so output that came in with the headers was lost. That happens when this
    thread is slow to read them, as on a loaded machine, and a command's output came back short or empty."""
    response = api._post_json(
        api._url("/exec/{0}/start", exec_id),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        data={"Tty": False, "Detach": False},
        stream=True,
    )
    api._raise_for_status(response)
    _socket(response).settimeout(None)  # a command may be quiet for longer than the API timeout
    return response


def output_reader(response: requests.Response) -> BinaryIO:
    """The buffered reader an exec's output is read from: never the socket beneath it."""
    return response.raw._fp.fp


def _socket(response: requests.Response) -> socket.socket:
    return response.raw._fp.fp.raw._sock


def frames(reader: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """The (stream, bytes) frames of Docker's multiplexed output, until it ends."""
    while len(header := reader.read(FRAME_HEADER.size)) == FRAME_HEADER.size:
        stream, length = FRAME_HEADER.unpack(header)
        data = reader.read(length)
        yield stream, data
        if len(data) < length:
            return


class _Flow(asyncio.ReadTransport):
    """What a StreamReader pauses when it holds more than twice its limit: the thread feeding it waits."""

    def __init__(self) -> None:
        super().__init__()
        self.flowing = threading.Event()
        self.flowing.set()
        self.stopped = False

    def pause_reading(self) -> None:
        if not self.stopped:
            self.flowing.clear()

    def resume_reading(self) -> None:
        self.flowing.set()

    def stop(self) -> None:
        """Never paused again: what is left of the output is read to its end."""
        self.stopped = True
        self.flowing.set()


class _ExecInput:
    """A process's stdin: the exec's socket, written on a thread of its own in order; close() half-closes
    the socket after what was written, which the engine passes on as the end of the process's stdin."""

    def __init__(self, connection: socket.socket, sending: ThreadPoolExecutor):
        self.connection, self.sending = connection, sending
        self.pending = bytearray()

    def write(self, data: bytes) -> None:
        self.pending += data

    async def drain(self) -> None:
        data, self.pending = bytes(self.pending), bytearray()
        await asyncio.wrap_future(self.sending.submit(self.connection.sendall, data))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # already ended
            self.sending.submit(self._end)

    def _end(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)


class ContainerProcess:
    """A process of a container started by an attached exec, as a client of asyncio's Process sees one:
    stdin written through the exec's socket, stdout and stderr StreamReaders fed from its frames by a
    thread of its own (paused while a reader holds more than twice `limit`), returncode once its output
    ended. The exec runs REPORT_PID's way: the first line of its stderr is its pid, the process group
    `pid` names, and is not the process's own output."""

    def __init__(self, response: requests.Response, limit: int):
        loop = asyncio.get_running_loop()
        self.response = response
        self.receiving = ThreadPoolExecutor(1, thread_name_prefix="docker-server-output")
        self.sending = ThreadPoolExecutor(1, thread_name_prefix="docker-server-input")
        self.stdin = _ExecInput(_socket(response), self.sending)
        self.stdout, self.stderr = asyncio.StreamReader(limit, loop), asyncio.StreamReader(limit, loop)
        self.flows = (_Flow(), _Flow())
        for reader, flow in zip((self.stdout, self.stderr), self.flows, strict=True):
            reader.set_transport(flow)
        self.returncode: int | None = None
        self.over = False  # its streams ended
        self.pid: asyncio.Future[str] = loop.create_future()
        self.in_flight = threading.Semaphore(IN_FLIGHT)
        self.received = loop.run_in_executor(self.receiving, self._receive, loop)

    def _receive(self, loop: asyncio.AbstractEventLoop) -> None:
        """Blocking: every frame handed to the event loop, until the output ends (or end() shuts the socket)."""
        pid = bytearray()
        with contextlib.suppress(OSError, ValueError):  # the socket shut under it
            for stream, data in frames(output_reader(self.response)):
                if stream == STDERR and not pid.endswith(b"\n"):
                    head, newline, data = data.partition(b"\n")
                    pid += head + newline
                    if newline:
                        loop.call_soon_threadsafe(_resolve, self.pid, pid.decode(errors="replace").strip())
                if data:
                    self.in_flight.acquire()
                    loop.call_soon_threadsafe(self._feed, self.stderr if stream == STDERR else self.stdout, data)
                if not all(flow.flowing.wait(ABANDONED) for flow in self.flows):
                    _shut(self.response)
                    return

    def _feed(self, reader: asyncio.StreamReader, data: bytes) -> None:
        try:
            if not self.over:  # what came after end() gave up waiting is dropped
                reader.feed_data(data)
        finally:
            self.in_flight.release()

    def ended(self, returncode: int | None) -> None:
        """Its output is over: returncode set, then the end of both streams for their readers."""
        self.returncode, self.over = returncode, True
        _resolve(self.pid, "")
        for reader in (self.stdout, self.stderr):
            reader.feed_eof()

    def shut(self) -> None:
        """No more of its output is read: the engine stops sending it (before the process is killed, so that
        its end never waits on output no one reads), and nothing keeps the reading thread."""
        for flow in self.flows:
            flow.stop()
        _shut(self.response)

    def close(self) -> None:
        self.response.close()
        self.receiving.shutdown(wait=False)
        self.sending.shutdown(wait=False)


def _shut(response: requests.Response) -> None:
    with contextlib.suppress(OSError):
        _socket(response).shutdown(socket.SHUT_RDWR)


def _resolve(future: asyncio.Future, value: str) -> None:
    if not future.done():
        future.set_result(value)


def readable_archive(paths: tuple[str, ...], limit: int) -> bytes:
    """Host files and folders (absolute paths) as a tar to put at the container's /, each at its own path:
    readable by every uid, writable by none, owned by NOBODY, so an agent without capabilities cannot change
    them, not even as root. Symbolic links as they are; FIFOs, devices and sockets left out. OSError when
    they hold more than `limit` bytes."""
    total = 0

    def readable(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        nonlocal total
        if not (info.isfile() or info.isdir() or info.issym() or info.islnk()):
            return None
        total += info.size
        if total > limit:
            raise OSError(f"the files it reads ({', '.join(paths)}) hold more than {limit // MB} MB")
        info.uid = info.gid = NOBODY
        info.uname = info.gname = ""
        info.mode = 0o555 if info.isdir() or info.mode & 0o111 else 0o444
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in paths:
            archive.add(path, arcname=path.lstrip("/"), filter=readable)
    return buffer.getvalue()
