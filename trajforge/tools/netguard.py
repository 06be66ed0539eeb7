"""Which addresses a URL chosen by a model may reach: public ones only.

A host is judged by every address it resolves to, after resolution, so every notation of an address
(decimal 2130706433, octal 0177.0.0.1, hex 0x7f.1, short 127.1, IPv4 written as IPv6) is judged by what a
client would connect to: getaddrinfo normalises them all. One blocked address blocks the host, since a
client may pick any of them. The HTTP client (fetch.py) then connects to an address checked here, so a
name that resolves to a public address for the check and to a private one later gains nothing.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from urllib.parse import urlsplit

Resolver = Callable[[str], Awaitable[Sequence[str]]]  # host -> the addresses it resolves to
NETWORK_SCHEMES = ("http", "https", "ws", "wss")

PRIVATE = "a private address"
DOCUMENTATION = "a documentation address"
# Named for the error message; the flags below catch what is not named here.
NAMED = tuple(
    (ip_network(network), reason)
    for network, reason in (
        ("0.0.0.0/8", "an unspecified address"),  # 0.0.0.0 reaches this machine on Linux
        ("127.0.0.0/8", "a loopback address"),
        ("169.254.169.254/32", "a link-local address (the cloud metadata service)"),
        ("169.254.0.0/16", "a link-local address"),
        ("10.0.0.0/8", PRIVATE),
        ("172.16.0.0/12", PRIVATE),
        ("192.168.0.0/16", PRIVATE),
        ("100.64.0.0/10", "a shared (CGNAT) address"),
        ("192.0.0.0/24", "a reserved address"),
        ("192.0.2.0/24", DOCUMENTATION),
        ("198.51.100.0/24", DOCUMENTATION),
        ("203.0.113.0/24", DOCUMENTATION),
        ("198.18.0.0/15", "a benchmarking address"),
        ("224.0.0.0/4", "a multicast address"),  # Python calls IPv4 multicast global
        ("255.255.255.255/32", "a broadcast address"),
        ("240.0.0.0/4", "a reserved address"),
        ("::/128", "an unspecified address"),
        ("::1/128", "a loopback address"),
        ("fe80::/10", "a link-local address"),
        ("fc00::/7", "a private (unique local) address"),
        ("fec0::/10", "a site-local address"),  # Python 3.11 calls these global
        ("ff00::/8", "a multicast address"),  # and these
        ("2001:db8::/32", DOCUMENTATION),
        ("2001:2::/48", "a benchmarking address"),
    )
)
FLAGS = (
    ("is_multicast", "a multicast address"),
    ("is_link_local", "a link-local address"),
    ("is_private", PRIVATE),
    ("is_reserved", "a reserved address"),
)
IPV4_COMPATIBLE = ip_network("::/96")  # deprecated ::a.b.c.d
NAT64 = ip_network("64:ff9b::/96")  # Python 3.11 calls 64:ff9b::7f00:1 global


DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def origin(host: str, port: int) -> str:
    """`host:port` as ToolSettings.trusted_origins names it (the mock model's own server)."""
    return f"{host.strip('[]').lower()}:{port}"


class Blocked(Exception):
    """A URL whose host may not be reached; str() is the message for the model."""

    def __init__(self, message: str):
        super().__init__(f"blocked: {message}")


def _embedded_ipv4(address: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries and may reach: mapped, compatible, NAT64, 6to4, Teredo."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in IPV4_COMPATIBLE or address in NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    return address.teredo[1] if address.teredo is not None else None


def blocked_reason(address: IPv4Address | IPv6Address) -> str | None:
    """Why `address` may not be reached ("a loopback address"), or None for a public address."""
    for network, reason in NAMED:
        if address in network:
            return reason
    if isinstance(address, IPv6Address) and (embedded := _embedded_ipv4(address)) is not None:
        embedded_reason = blocked_reason(embedded)
        if embedded_reason is not None:
            return f"{embedded_reason} ({embedded} written as IPv6)"
        if address.ipv4_mapped is not None:  # a socket connects to the public IPv4 address itself
            return None
    for flag, reason in FLAGS:
        if getattr(address, flag):
            return reason
    return None if address.is_global else "not a public address"


async def system_resolver(host: str) -> list[str]:
    """The addresses getaddrinfo gives `host`, in its order; it runs in a thread, off the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def resolve_checked(host: str, resolver: Resolver = system_resolver) -> list[str]:
    """The addresses `host` resolves to, all of them public; raises Blocked naming the first that is not,
    and OSError (socket.gaierror) when the name does not resolve."""
    addresses = list(await resolver(host))
    for address in addresses:
        reason = blocked_reason(ip_address(address))
        if reason is not None:
            literal = host.strip("[]").lower() == address.lower()
            raise Blocked(f"{address} is {reason}" if literal else f"{host} resolves to {address}, {reason}")
    return addresses


async def reachable_addresses(
    host: str, port: int, resolver: Resolver = system_resolver, trusted: frozenset[str] = frozenset()
) -> list[str]:
    """The addresses a guarded client may connect to for host:port: the host itself for a trusted origin,
    else resolve_checked's (Blocked, or OSError when the name does not resolve)."""
    return [host] if origin(host, port) in trusted else await resolve_checked(host, resolver)


async def check_url(
    url: str, allow_private: bool = False, resolver: Resolver = system_resolver, trusted: frozenset[str] = frozenset()
) -> None:
    """Raise Blocked unless `url` is an http(s) or ws(s) URL whose host resolves to public addresses only
    (any URL with `allow_private`). A check, not a pin: a client that resolves the name again itself may
    be answered differently, so the HTTP client connects through fetch.py's guard instead."""
    if allow_private:
        return
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed [ of an IPv6 address
        raise Blocked(f"not a valid URL: {url!r}") from None
    if parts.scheme not in NETWORK_SCHEMES:
        raise Blocked(f"only http and https URLs are fetched, not {parts.scheme or 'this'}: {url!r}")
    if not host:
        raise Blocked(f"no host in {url!r}")
    if origin(host, parts.port or DEFAULT_PORTS[parts.scheme]) in trusted:
        return
    await resolve_checked(host, resolver)
