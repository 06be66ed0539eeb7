"""A sample's own network namespace with nothing in it but its loopback, shared by the sample's agent commands
under bwrap, for a root runner without --sandbox_network.

Each bwrap command used to make a network namespace of its own (--unshare-net) and bring its loopback up:
about 1 ms of CPU a command, with the kernel's teardown of the namespace after it, for a namespace that holds
nothing. Now the sample's agent commands join one made here as the sample opens, as --sandbox_network's
commands join the sample's (netns.py), and bwrap keeps it (--share-net). They see what a command of their own
saw: a loopback and no other interface, and no socket of an earlier command (TCP's TIME_WAIT is off there: a
port a finished command served is free for the next). The runner makes it in the host's user namespace, so no
sandboxed command has any capability over it (none can add an interface, a route or a rule); what the sample's
commands share is its loopback, which only the sample's own processes reach, and those end with each command
(its PID namespace) or with the sample. The verification's commands and the sample's spawned services (a tool
server in the sandbox) still make their own, as before: the clean room sees nothing of the agent's, and the
agent's commands reach no port of a service by the loopback.

The namespace is made on a thread of its own that ends once it has the namespace's descriptor: no other thread
of this process ever runs in it, even if something fails half way. Commands enter it by that descriptor, which
this process keeps open and close-on-exec (holder.join); a forked child closes it first thing (a lock held
from its opening to its listing, and across a fork: no child gets one it does not list). Where it cannot be
made (a root runner without CAP_SYS_ADMIN), the sample's commands make their own namespaces as before."""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

from trajforge.environments import holder
from trajforge.environments.libc import libc

CLONE_NEWNET = 0x40000000
SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40
_open: set[int] = set()  # this process's namespaces' descriptors
_lock = threading.Lock()  # held from a descriptor's open to its entry in _open, and across fork
_cannot: list[str] = []  # why this process could not make one: it tries no more (review 15)


class Loopback(holder.Entered):
    """One sample's namespace: made by open(), entered through join(), gone with close() and its last process."""

    KIND = "net"

    def open(self) -> Loopback:
        """Make the namespace; OSError when it cannot be (then at once for every later sample of this process:
        a read-only /proc/sys, in a container or a service with ProtectKernelTunables, stays so). Blocking."""
        if _cannot:  # a new exception each time: one raised again would carry every earlier traceback
            raise OSError(_cannot[0])
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="loopback") as thread:  # ends with the `with`
                self.fd = thread.submit(_made).result()
        except OSError as exc:
            _cannot.append(str(exc))
            raise
        return self

    def close(self) -> None:
        if self.fd is not None:
            with _lock:
                _open.discard(self.fd)
                os.close(self.fd)
            self.fd = None


def _made() -> int:
    """On a thread that ends after it: that thread moved into a new network namespace, its loopback up, and
    the namespace's descriptor (close-on-exec)."""
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    with _lock:
        fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        _open.add(fd)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # a socket of the new namespace
            fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))
        # No TIME_WAIT: a port a finished command served is free for the next, as in a namespace of its own.
        with open("/proc/sys/net/ipv4/tcp_max_tw_buckets", "w") as buckets:  # this thread's namespace's
            buckets.write("0")
    except BaseException:
        with _lock:
            _open.discard(fd)
            os.close(fd)
        raise
    return fd


def _forget() -> None:
    """In a forked child: the parent's namespaces are the parent's alone."""
    for fd in _open:
        os.close(fd)
    _open.clear()
    _lock.release()


os.register_at_fork(before=_lock.acquire, after_in_parent=_lock.release, after_in_child=_forget)
