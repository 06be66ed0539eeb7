"""No URL a model chooses reaches a non-public address: the policy (netguard.py) with stand-in resolvers for
every address class and notation, and fetch() against a real site on 127.0.0.1, directly, in other
notations, through redirects and through a DNS rebinding, with a stand-in "internet" whose public
addresses are all served by that site (nothing leaves the machine)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from ipaddress import ip_address
from urllib.parse import quote

import httpcore
import pytest
from tool_session import call, tool_session

from trajforge.tools.fetch import Fetched, FetchError, GuardedNetwork, fetch, http_client
from trajforge.tools.netguard import Blocked, blocked_reason, check_url, resolve_checked, system_resolver

PUBLIC = "93.184.216.34"  # a public address; the stand-in internet serves it from the local site
OTHER_PUBLIC = "2606:4700:4700::1111"
NAMES = {
    "public.test": [PUBLIC],
    "second.test": [OTHER_PUBLIC],
    "intranet.test": ["10.0.0.7"],
    "metadata.test": ["169.254.169.254"],
    "mixed.test": [PUBLIC, "192.168.1.20"],
}
LOOPBACK_NOTATIONS = ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433", "127.1", "0x7f.1", "0x7f000001")

LOOPBACK = "a loopback address"
PRIVATE = "a private address"
LINK_LOCAL = "a link-local address"
DOCUMENTATION = "a documentation address"
CLASSES = [
    ("127.0.0.1", LOOPBACK),
    ("127.255.255.254", LOOPBACK),
    ("::1", LOOPBACK),
    ("10.1.2.3", PRIVATE),
    ("172.16.0.1", PRIVATE),
    ("172.31.255.255", PRIVATE),
    ("192.168.1.1", PRIVATE),
    ("fc00::1", "a private (unique local) address"),
    ("fd12:3456::1", "a private (unique local) address"),
    ("169.254.1.1", LINK_LOCAL),
    ("169.254.169.254", "a link-local address (the cloud metadata service)"),
    ("fe80::1", LINK_LOCAL),
    ("fe80::1%lo", LINK_LOCAL),
    ("fec0::1", "a site-local address"),
    ("100.64.0.1", "a shared (CGNAT) address"),
    ("100.127.255.254", "a shared (CGNAT) address"),
    ("224.0.0.1", "a multicast address"),
    ("239.255.255.250", "a multicast address"),
    ("ff02::1", "a multicast address"),
    ("240.0.0.1", "a reserved address"),
    ("192.0.0.8", "a reserved address"),
    ("0.0.0.0", "an unspecified address"),
    ("0.1.2.3", "an unspecified address"),
    ("::", "an unspecified address"),
    ("255.255.255.255", "a broadcast address"),
    ("198.18.0.1", "a benchmarking address"),
    ("2001:2::1", "a benchmarking address"),
    ("192.0.2.1", DOCUMENTATION),
    ("198.51.100.1", DOCUMENTATION),
    ("203.0.113.1", DOCUMENTATION),
    ("2001:db8::1", DOCUMENTATION),
    # IPv4 written as IPv6: judged by the IPv4 address inside
    ("::ffff:127.0.0.1", "a loopback address (127.0.0.1 written as IPv6)"),
    ("::ffff:169.254.169.254", "a link-local address (the cloud metadata service) (169.254.169.254 written as IPv6)"),
    ("::ffff:10.0.0.1", "a private address (10.0.0.1 written as IPv6)"),
    ("::127.0.0.1", "a loopback address (127.0.0.1 written as IPv6)"),  # IPv4-compatible
    ("64:ff9b::10.0.0.1", "a private address (10.0.0.1 written as IPv6)"),  # NAT64
    ("2002:c0a8:101::1", "a private address (192.168.1.1 written as IPv6)"),  # 6to4
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a documentation address (192.0.2.45 written as IPv6)"),  # Teredo
    # what is left of those prefixes is not public either
    ("::8.8.8.8", "a reserved address"),
    ("64:ff9b::8.8.8.8", "a reserved address"),
    ("100::1", PRIVATE),
]
PUBLIC_ADDRESSES = ("8.8.8.8", "1.1.1.1", PUBLIC, OTHER_PUBLIC, "::ffff:8.8.8.8", "2002:808:808::1")


async def stand_in_resolver(host: str) -> list[str]:
    """NAMES as a DNS would answer them; address literals and localhost as this machine does."""
    return NAMES[host] if host in NAMES else await system_resolver(host)


class StandInInternet(httpcore.AsyncNetworkBackend):
    """The network behind the guard: records every address it is asked to connect to; the stand-in public
    addresses lead to the local site (same port), anything else is unreachable."""

    def __init__(self):
        self.connected: list[str] = []
        self.tls: list[tuple[str | None, bool, ssl.VerifyMode]] = []  # (SNI name, check_hostname, verify_mode)

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        self.connected.append(host)
        if host not in (PUBLIC, OTHER_PUBLIC):
            raise httpcore.ConnectError(f"the stand-in internet has no route to {host}")
        return TlsRecorder(await httpcore.AnyIOBackend().connect_tcp("127.0.0.1", port, timeout=timeout), self.tls)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class TlsRecorder(httpcore.AsyncNetworkStream):
    """A plain connection that records how TLS would be started on it, then refuses it (no certificate)."""

    def __init__(self, stream: httpcore.AsyncNetworkStream, tls: list):
        self.stream, self.tls_seen = stream, tls

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self.stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.stream.aclose()

    def get_extra_info(self, info: str):
        return self.stream.get_extra_info(info)

    async def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        self.tls_seen.append((server_hostname, ssl_context.check_hostname, ssl_context.verify_mode))
        await self.stream.aclose()
        raise httpcore.ConnectError("the stand-in internet speaks no TLS")


def get(url: str, allow_private: bool = False, network: GuardedNetwork | None = None) -> Fetched:
    async def go() -> Fetched:
        async with http_client(allow_private, network) as client:
            return await fetch(client, url, max_bytes=100_000, timeout=5.0, accept=lambda media_type: True)

    return asyncio.run(go())


def blocked(url: str, network: GuardedNetwork | None = None) -> str:
    with pytest.raises(FetchError) as refused:
        get(url, network=network)
    return str(refused.value)


def resolved(host: str, resolver=stand_in_resolver) -> list[str]:
    return asyncio.run(resolve_checked(host, resolver))


# the policy


@pytest.mark.parametrize(("address", "reason"), CLASSES)
def test_every_non_public_class_is_blocked_with_its_reason(address, reason):
    assert blocked_reason(ip_address(address)) == reason


@pytest.mark.parametrize("address", PUBLIC_ADDRESSES)
def test_public_addresses_pass(address):
    assert blocked_reason(ip_address(address)) is None


def test_a_host_passes_with_all_its_addresses_and_one_blocked_address_blocks_it():
    assert resolved("public.test") == [PUBLIC]
    with pytest.raises(Blocked, match=r"^blocked: mixed.test resolves to 192.168.1.20, a private address$"):
        resolved("mixed.test")
    with pytest.raises(Blocked, match=r"^blocked: 127.0.0.1 is a loopback address$"):
        resolved("127.0.0.1")
    with pytest.raises(socket.gaierror):  # an unknown name is not blocked: it is not found
        resolved("nowhere.invalid")


@pytest.mark.parametrize("host", [*(h.strip("[]") for h in LOOPBACK_NOTATIONS), "017700000001", "0x7f.0.0.1"])
def test_every_notation_of_loopback_is_resolved_as_a_client_would_and_blocked(host):
    with pytest.raises(Blocked) as refused:
        resolved(host, system_resolver)
    assert str(refused.value).startswith("blocked: ") and LOOPBACK in str(refused.value)


def test_check_url_for_the_browser_and_image_urls():
    def check(url: str, allow_private: bool = False) -> None:
        asyncio.run(check_url(url, allow_private, stand_in_resolver))

    check("https://public.test/page")
    check("wss://second.test/socket")
    for url, message in [
        ("http://metadata.test/latest/meta-data/", "metadata.test resolves to 169.254.169.254, a link-local address"),
        ("http://public.test@127.0.0.1:8080/", "127.0.0.1 is a loopback address"),  # the host is after the @
        ("http://127.0.0.1#@public.test/", "127.0.0.1 is a loopback address"),
        ("http://[::ffff:a00:1]/", "::ffff:a00:1 resolves to ::ffff:10.0.0.1, a private address"),
        ("file:///etc/passwd", "only http and https URLs are fetched, not file"),
        ("http:///no-host", "no host in"),
        ("http://[::1/", "not a valid URL"),
    ]:
        with pytest.raises(Blocked, match=f"^blocked: {message}"):
            check(url)

    async def no_lookup(host: str) -> list[str]:
        raise AssertionError("allow_private needs no lookup")

    asyncio.run(check_url("http://127.0.0.1/", True, no_lookup))


# fetch() on 127.0.0.1


def test_the_local_site_is_blocked_in_every_notation_and_fetched_when_private_urls_are_allowed(site):
    port, served = site.url.rsplit(":", 1)[1], len(site.requests)  # the site serves the whole test session
    for host in (*LOOPBACK_NOTATIONS, "[::1]", "0.0.0.0"):
        url = f"http://{host}:{port}/article.html"
        message = blocked(url)
        assert message.startswith("blocked: ") and ("loopback" in message or "unspecified" in message), message
    assert len(site.requests) == served  # nothing reached the site
    for host in (*LOOPBACK_NOTATIONS, "0.0.0.0"):  # the same fetch works: the block was the guard, not the URL
        page = get(f"http://{host}:{port}/article.html", allow_private=True)
        assert page.status == 200 and b"Anemones" in page.body
    assert len(site.requests) == served + len(LOOPBACK_NOTATIONS) + 1


def test_an_octal_address_is_not_a_url_httpx_fetches(site):
    port = site.url.rsplit(":", 1)[1]
    assert blocked(f"http://0177.0.0.1:{port}/") == (
        f"http://0177.0.0.1:{port}/ is not a valid URL: Invalid IPv4 address: '0177.0.0.1'"
    )


def test_web_extract_says_blocked_and_works_with_allow_private_urls(site):
    async def extract(**settings) -> dict:
        async with tool_session(**settings) as session:
            return await call(session, "web_extract", urls=[f"{site.url}/article.html"])

    refused = asyncio.run(extract())
    assert refused["error"] == "blocked: 127.0.0.1 is a loopback address"  # a tool error the model reads
    (page,) = asyncio.run(extract(allow_private_urls=True))["results"]
    assert "Anemones" in page["content"]


# redirects and DNS rebinding, through the stand-in internet


def to(url: str) -> str:
    return f"/redirect?to={quote(url, safe='')}"


def test_every_redirect_hop_is_checked(site):
    port = site.url.rsplit(":", 1)[1]
    internet = StandInInternet()
    guarded = GuardedNetwork(stand_in_resolver, internet)
    page = get(f"http://public.test:{port}/article.html", network=guarded)  # a public host is fetched
    assert page.status == 200 and b"Anemones" in page.body
    assert site.requests[-1][2]["Host"] == f"public.test:{port}"  # the name, not the address it connected to

    assert blocked(f"http://public.test:{port}{to(f'http://127.0.0.1:{port}/article.html')}", guarded) == (
        "blocked: 127.0.0.1 is a loopback address"
    )
    assert blocked(f"http://public.test:{port}{to(f'http://2130706433:{port}/')}", guarded) == (
        "blocked: 2130706433 resolves to 127.0.0.1, a loopback address"
    )
    # public.test -> second.test (public, allowed) -> intranet.test (private): the third hop is refused
    third = f"http://intranet.test:{port}/admin"
    second = f"http://second.test:{port}{to(third)}"
    assert blocked(f"http://public.test:{port}{to(second)}", guarded) == (
        "blocked: intranet.test resolves to 10.0.0.7, a private address"
    )
    assert [path for _, path, _ in site.requests[-2:]] == [to(second), to(third)]  # both earlier hops were served
    assert blocked(f"http://public.test:{port}{to('http://metadata.test/latest/meta-data/')}", guarded) == (
        "blocked: metadata.test resolves to 169.254.169.254, a link-local address (the cloud metadata service)"
    )
    assert set(internet.connected) == {PUBLIC, OTHER_PUBLIC}  # never a blocked address, never a name


def test_a_name_that_rebinds_to_loopback_after_the_check_is_never_connected_to_loopback(site):
    port = site.url.rsplit(":", 1)[1]
    lookups: list[str] = []

    async def rebinding(host: str) -> list[str]:  # public for the first lookup, loopback for every later one
        lookups.append(host)
        return [PUBLIC] if len(lookups) == 1 else ["127.0.0.1"]

    internet = StandInInternet()
    guarded = GuardedNetwork(rebinding, internet)
    page = get(f"http://rebind.test:{port}/article.html", network=guarded)
    assert page.status == 200 and lookups == ["rebind.test"]  # one lookup: the address checked is the one used
    assert internet.connected == [PUBLIC]
    assert blocked(f"http://rebind.test:{port}/article.html", guarded) == (  # a new connection looks up again
        "blocked: rebind.test resolves to 127.0.0.1, a loopback address"
    )
    assert internet.connected == [PUBLIC]


def test_tls_is_started_on_the_name_with_its_certificate_checked(site):
    port = site.url.rsplit(":", 1)[1]
    internet = StandInInternet()
    message = blocked(f"https://public.test:{port}/", GuardedNetwork(stand_in_resolver, internet))
    assert message == f"could not fetch https://public.test:{port}/: the stand-in internet speaks no TLS"
    assert internet.connected == [PUBLIC]
    assert internet.tls == [("public.test", True, ssl.CERT_REQUIRED)]
