"""--sandbox_network for bwrap: each sample's commands share a network namespace of its own that reaches
outward only, never this machine.

The namespace is made by `pasta` (Debian's passt): pasta runs a small holder process in a new user and
network namespace and carries the namespace's TCP, UDP and ICMP to the outside through ordinary sockets
of its own. Its options turn off every way back to the host: no mapping of the gateway's address to the
host's loopback (`--no-map-gw`, which is not its default), no forwarding of ports between the host's
loopback and the namespace's (`-t/-u/-T/-U none`, whose default forwards every bound port). The
namespace's own loopback is its own (a sandboxed server on 127.0.0.1 is reachable by the sample's other
commands only).

What pasta would still carry is a connection to an address of the host itself (its sockets live in the
host's namespace): the holder, root of pasta's user namespace and so of its network namespace, first
loads an nftables table there that rejects every packet to the host's own addresses (read when the
sample starts: /proc/net/fib_trie, /proc/net/if_inet6), to link-local addresses (169.254.0.0/16,
fe80::/10: cloud metadata services among them) and to the AWS metadata address fd00:ec2::254. The
sandboxed commands cannot change that table: they join only the network namespace (nsenter --net,
before bwrap), and bwrap's user namespace, or the worker's two-uid one, holds no capability over
pasta's user namespace, which owns it. A root runner runs pasta as PASTA_HOST_UID, a uid no other
process has, so that no host process gains rights over the namespace through its owner.

Every command enters the namespace by a descriptor the worker keeps open, never by a pid that could be
reused: nsenter, in the command's own exec chain, opens it as /proc/<worker>/fd/N while the worker waits on
it (holder.join); the descriptor is close-on-exec, so no command holds it. A sample whose pasta died
has no network rather than the host's. Where pasta, nsenter or nft is missing, --sandbox_network stops the run at start
(exit 2) saying what to install.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
import shutil
import subprocess
import tempfile

from trajforge.environments import holder
from trajforge.environments.programs import program
from trajforge.errors import UsageError

PASTA_HOST_UID = 65532  # beside the verifier's 65533 and nobody's 65534: no account of the host has it
TOOLS = {"pasta": "passt", "nsenter": "util-linux", "nft": "nftables", "setpriv": "util-linux"}
PASTA_OPTIONS = ["-q", "-f", "--config-net", "--no-map-gw", "-t", "none", "-u", "none", "-T", "none", "-U", "none"]
LINK_LOCAL = ("169.254.0.0/16", "fe80::/10")
METADATA = ("fd00:ec2::254",)  # AWS's IPv6 metadata service: a unique-local address, not a link-local one
# The holder loads the rules, waits until pasta has configured the namespace (its default route),
# says its pid as the host's /proc sees it (pasta gives it a PID namespace: $$ is 1) and stays until its
# stdin closes: when the worker closes it, or dies.
HOLDER = (
    'printf "%s" "$1" | nft -f - || exit 1; '
    "for i in $(seq 100); do ip route show default | grep -q . && break; sleep 0.01; done; "
    "read pid rest </proc/self/stat; echo $pid; read line"
)
START_TIMEOUT = 30


def missing() -> str | None:
    """What to install for --sandbox_network, or None when every tool it runs is here."""
    absent = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    return f"apt-get install {' '.join(absent)}" if absent else None


def check() -> None:
    """Stop the run (exit 2) when no sample could have its network namespace here; a trial makes one."""
    if install := missing():
        raise UsageError(f"--sandbox_network needs pasta, nsenter and nft on PATH: install them ({install})")
    try:
        SampleNetwork().open().close()
    except OSError as exc:
        raise UsageError(
            f"--sandbox_network: cannot make the sandbox's network namespace here ({exc}); it needs "
            "user namespaces, pasta (apt-get install passt) and nftables in the kernel (nf_tables)"
        ) from None


def host_addresses() -> list[str]:
    """The host's own addresses and local ranges but the loopback's (those are the namespace's own)."""
    found: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/net/fib_trie") as handle:
        last = ""
        for line in handle:
            text = line.strip()
            if text.startswith("|--"):
                last = text.split()[1]
            elif text.endswith("host LOCAL") and last:
                found.add(f"{last}{text.split()[0]}")  # 192.0.2.2/32
    with contextlib.suppress(OSError), open("/proc/net/if_inet6") as handle:
        for line in handle:
            digits = line.split()[0]
            found.add(str(ipaddress.IPv6Address(bytes.fromhex(digits))))
    networks = [ipaddress.ip_network(text, strict=False) for text in found]
    return sorted(str(net) for net in networks if not net.is_loopback)


def rules(addresses: list[str]) -> str:
    """The namespace's nftables table: every packet to `addresses`, link-local and metadata refused."""
    blocked = [ipaddress.ip_network(a) for a in (*addresses, *LINK_LOCAL, *METADATA)]
    v4 = ipaddress.collapse_addresses(n for n in blocked if isinstance(n, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(n for n in blocked if isinstance(n, ipaddress.IPv6Network))
    lines = []
    for family, networks in (("ip", list(map(str, v4))), ("ip6", list(map(str, v6)))):
        found = ", ".join(networks)
        # TCP refused at once (a reset), UDP dropped; ICMP passes (IPv6 needs it to its link-local router)
        lines.append(f"{family} daddr {{ {found} }} meta l4proto tcp reject with tcp reset")
        lines.append(f"{family} daddr {{ {found} }} meta l4proto udp drop")
    body = "\n".join(f"    {line}" for line in lines)
    return (
        "table inet sandbox {\n  chain out {\n    type filter hook output priority 0; policy accept;\n"
        f"{body}\n  }}\n}}\n"
    )


class SampleNetwork(holder.Entered):
    """One sample's network namespace: made by open(), entered by commands through join(), gone with close()."""

    KIND = "net"

    def __init__(self) -> None:
        super().__init__()
        self.pasta: subprocess.Popen | None = None

    def open(self) -> SampleNetwork:
        """Start pasta and its holder; raise OSError when the namespace cannot be made. Blocking."""
        argv = [
            program("pasta"),
            *PASTA_OPTIONS,
            "--",
            "sh",
            "-c",
            HOLDER,
            "sh",
            rules(host_addresses()),
        ]
        if os.geteuid() == 0:  # pasta would drop to nobody itself, then fail to map its own namespace
            uid = str(PASTA_HOST_UID)
            argv = [program("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
        with tempfile.TemporaryFile() as log:  # what pasta says (a pipe nobody reads could fill and stop it)
            self.pasta = holder.start(argv, log)
            try:
                self.fd = holder.namespace(self.pasta, f"/proc/{self._holder(log)}/ns/net")
            except BaseException:
                self.close()
                raise
        return self

    def _holder(self, log) -> int:
        """The holder's pid, once its rules are in and pasta has configured the namespace."""
        assert self.pasta is not None and self.pasta.stdout is not None
        ready, _, _ = select.select([self.pasta.stdout], [], [], START_TIMEOUT)
        line = self.pasta.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            self.pasta.kill()
            self.pasta.wait()
            log.seek(0)
            said = " ".join(t for t in log.read().decode(errors="replace").splitlines() if "syslog" not in t)
            raise OSError(f"pasta could not make the namespace: {said.strip()[-300:] or 'no output'}")
        return int(line)

    def close(self) -> None:
        """End pasta and its holder (closing the holder's stdin ends both). Blocking."""
        self.fd = None  # closed with pasta
        if self.pasta is not None:
            holder.end(self.pasta)
            self.pasta = None
