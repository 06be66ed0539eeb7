"""The user's Python verifier: `--verifier=path/to/file.py:function` or `module:function`.

It is loaded when the run starts (a missing file, module or function stops it with exit 2) and called
for every finished sample as `function(record, env)`, in a child process forked from the worker for
that call. Why a process and not a thread: a verifier that hangs must end at --verify_timeout, and a
thread cannot be killed (it would go on holding the worker's GIL and memory); a process is SIGKILLed.
The child reaches the sample's environment, still open in the worker, through `env`, whose `exec` and
`read_file` send each call over a socket pair to the worker, which runs it on its event loop and sends
the answer back. Whatever the child prints is kept as the output when the verifier gives no `info`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import importlib
import importlib.util
import inspect
import io
import json
import math
import os
import pickle
import signal
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from trajforge.environments import ExecResult
from trajforge.errors import UsageError
from trajforge.flags.values import is_file_spec
from trajforge.verification.result import VerifySettings, result

PR_SET_PDEATHSIG = 1
HEADER = struct.Struct(">I")
FILE_ERRORS = (FileNotFoundError, IsADirectoryError, ValueError, OSError)  # what read_file raises, by contract


@functools.cache
def load_verifier(spec: str) -> Callable:
    """The function a normalized spec names; UsageError saying what is wrong. Cached: workers forked
    after the start find it loaded."""
    target, _, name = spec.rpartition(":")
    try:
        if is_file_spec(target):
            if not Path(target).is_file():
                raise UsageError(f"--verifier: {target} does not exist or is not a file")
            module_spec = importlib.util.spec_from_file_location(f"batch_runner_verifier_{Path(target).stem}", target)
            if module_spec is None or module_spec.loader is None:
                raise UsageError(f"--verifier: {target} cannot be loaded as a Python file")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except UsageError:
        raise
    except Exception as exc:  # the user's module failed to import: say why
        raise UsageError(f"--verifier: {target} cannot be loaded ({type(exc).__name__}: {exc})") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UsageError(f"--verifier: {target} has no function {name!r}")
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        raise UsageError(f"--verifier: {name} must take two arguments, (record, env)") from None
    except ValueError:  # a builtin without a signature: let the call decide
        pass
    return function


class VerifierEnv:
    """What a verifier gets as `env`: the sample's environment, still open."""

    def __init__(self, sock: socket.socket, tests_dir: str | None = None):
        self._sock = sock
        self.tests_dir = tests_dir  # the task's hidden tests, as the sample's commands see the path (or None)

    def exec(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run `command` with sh -c in the sample's working directory: ExecResult(output, exit_code,
        error, timed_out), output being stdout and stderr merged. Bounded by `timeout` and by what is
        left of --verify_timeout."""
        return self._ask("exec", str(command), timeout)

    def read_file(self, path: str) -> str:
        """The text of a file of the sample (relative to its working directory); FileNotFoundError,
        IsADirectoryError, ValueError (too big) or OSError as the tools get them."""
        return self._ask("read_file", str(path))

    def _ask(self, *request):
        _send(self._sock, pickle.dumps(request))
        kind, value = pickle.loads(_receive(self._sock))
        if kind == "raise":
            raise value
        return value


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(HEADER.pack(len(payload)) + payload)


def _receive(sock: socket.socket) -> bytes:
    size = HEADER.unpack(_exactly(sock, HEADER.size))[0]
    return _exactly(sock, size)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the verifier's connection")
        data += chunk
    return bytes(data)


def _child(function: Callable, record: dict, sock: socket.socket, tests_dir: str | None) -> NoReturn:
    """The forked child: call the verifier, send back ("result", value, prints) or ("error", text,
    prints), and leave without running anything of the worker's (no atexit, no flush of its buffers)."""
    try:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)  # the worker's event loop must not hear our signals
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, signal.SIG_DFL)
        with contextlib.suppress(OSError, AttributeError):  # a worker killed with -9 takes us along
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        sock.setblocking(True)
        prints = io.StringIO()
        with contextlib.redirect_stdout(prints), contextlib.redirect_stderr(prints):
            try:
                message = ("result", function(record, VerifierEnv(sock, tests_dir)))
            except BaseException as exc:
                message = ("error", f"verifier raised {type(exc).__name__}: {exc}")
        try:
            payload = pickle.dumps((*message, prints.getvalue()))
        except Exception as exc:
            what = type(message[1]).__name__
            payload = pickle.dumps(("error", f"verifier returned {what}, which cannot be sent back ({exc})", ""))
        _send(sock, payload)
    finally:
        os._exit(0)


class VerifierFailed(Exception):
    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


async def _serve(sock: socket.socket, env, settings: VerifySettings) -> tuple:
    """Answer the child's calls on `env` until it sends its result: (value, prints)."""
    loop = asyncio.get_running_loop()

    async def exactly(size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = await loop.sock_recv(sock, size - len(data))
            if not chunk:
                raise VerifierFailed("verifier process ended without an answer")
            data += chunk
        return bytes(data)

    while True:
        payload = await exactly(HEADER.unpack(await exactly(HEADER.size))[0])
        try:
            message = pickle.loads(payload)
        except Exception as exc:  # an object of a class only the verifier's module knows
            raise VerifierFailed(f"verifier returned something the worker cannot read ({exc})") from None
        if message[0] == "result":
            return message[1], message[2]
        if message[0] == "error":
            raise VerifierFailed(message[1], message[2])
        try:
            if message[0] == "exec":
                asked = message[2]
                valid = isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0
                answer = ("ok", await env.exec(message[1], asked if valid else settings.timeout, capped=False))
            else:
                answer = ("ok", await env.read_file(message[1]))
        except FILE_ERRORS as exc:
            answer = ("raise", type(exc)(str(exc)))
        payload = pickle.dumps(answer)
        await loop.sock_sendall(sock, HEADER.pack(len(payload)) + payload)


def reading(value, threshold: float) -> tuple[float, bool, str]:
    """(reward, passed, output) from what a Python verifier returned: a number, or a dict with a number
    `reward`, optionally a bool `passed` (default: reward >= threshold) and `info` (kept as output).
    ValueError for anything else."""
    if isinstance(value, dict):
        reward, passed, info = value.get("reward"), value.get("passed"), value.get("info")
        if passed is not None and not isinstance(passed, bool):
            raise ValueError(f"'passed' must be true or false, got {passed!r}"[:300])
        output = info if isinstance(info, str) else "" if info is None else json.dumps(info, default=str)
    else:
        reward, passed, output = value, None, ""
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise ValueError(
            f"returned {value!r}"[:300] + "; return a finite number (the reward) or a dict {reward, passed, info}"
        )
    return float(reward), reward >= threshold if passed is None else passed, output


async def call_verifier(settings: VerifySettings, record: dict, env, started: float) -> dict:
    """Run the verifier on one sample within settings.timeout; the verification dict."""
    function = load_verifier(settings.verifier)
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        _child(function, record, theirs, getattr(env, "tests_dir", None))
    theirs.close()
    ours.setblocking(False)
    try:
        async with asyncio.timeout(settings.timeout):
            value, prints = await _serve(ours, env, settings)
    except TimeoutError:
        return result(False, 0.0, "", started, f"verifier timed out after {settings.timeout:g}s")
    except VerifierFailed as exc:
        return result(False, 0.0, exc.output, started, str(exc))
    finally:
        ours.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # done or hanging: either way it goes now
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # a killed process is reaped at once
    try:
        reward, passed, info = reading(value, settings.threshold)
    except ValueError as exc:
        return result(False, 0.0, prints, started, f"verifier {exc}")
    return result(passed, reward, info or prints, started)
