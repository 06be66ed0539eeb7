"""The browser reaches only public addresses unless --allow_private_urls: every request of a page goes
through the worker's guard proxy (trajforge/tools/browser/guard.py), each redirect hop included.

Real Chromium against local pages, which are all loopback, so the trusted origin (what the mock model's
server is) stands in for a public site; hops to hosts no loopback test can reach go through the proxy
with a stand-in resolver."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import pytest
from local_site import LocalSite
from tool_session import call, tool_session

from trajforge.tools.browser.guard import BLOCKED_HEADER, HEADER_LIMIT, GuardProxy
from trajforge.tools.browser.runtime import BrowserLauncher, launch_problem
from trajforge.tools.browser.service import browser_service
from trajforge.tools.settings import ToolSettings, find_browser

CHROMIUM = find_browser(os.environ)
PROBLEM = launch_problem(CHROMIUM)
needs_chromium = pytest.mark.skipif(PROBLEM is not None, reason=f"no browser can be launched here: {PROBLEM}")

PUBLIC = "93.184.216.34"
STAND_IN_DNS = {"public.test": [PUBLIC], "metadata.test": ["169.254.169.254"], "intranet.test": [PUBLIC, "10.1.2.3"]}
METADATA_BLOCKED = (
    "blocked: metadata.test resolves to 169.254.169.254, a link-local address (the cloud metadata service)"
)


@pytest.fixture
def site():
    """A fresh site per test (conftest's is shared by the session): these tests count its requests."""
    with LocalSite() as local:
        yield local


@pytest.fixture
def other_site():
    """A second loopback server, on another port: what a trusted page must not reach."""
    with LocalSite() as local:
        yield local


def port(site: LocalSite) -> int:
    return int(site.url.rsplit(":", 1)[1])


def trusted_settings(site: LocalSite, endpoint: str | None = None) -> dict:
    """Tool settings to which `site` is what the mock model's server is to a run: a trusted origin."""
    trusted = frozenset({f"127.0.0.1:{port(site)}"})
    return {"browser_executable": CHROMIUM, "browser_endpoint": endpoint, "trusted_origins": trusted}


def trusted_session(site: LocalSite, endpoint: str | None = None):
    return tool_session(**trusted_settings(site, endpoint))


@contextlib.contextmanager
def runs_browser(site: LocalSite):
    """The address of a run's browser service with the same settings as `trusted_session`."""
    with browser_service(CHROMIUM) as service:
        yield service.ready(ToolSettings("v", "i", **trusted_settings(site)))


@needs_chromium
def test_loopback_pages_are_blocked_in_every_notation_and_open_with_allow_private_urls(site):
    notations = [site.url, f"http://127.1:{port(site)}", f"http://[::ffff:127.0.0.1]:{port(site)}"]
    notations += [f"http://2130706433:{port(site)}", f"http://localhost:{port(site)}"]

    async def navigate(**settings):
        async with tool_session(browser_executable=CHROMIUM, **settings) as session:
            return [await call(session, "browser_navigate", url=f"{url}/article.html") for url in notations]

    for url, result in zip(notations, asyncio.run(navigate()), strict=True):
        assert set(result) == {"error"}, url
        assert result["error"].startswith("blocked: ") and "a loopback address" in result["error"], url
    assert site.requests == []
    opened = asyncio.run(navigate(allow_private_urls=True))
    assert [(page["title"], page["status"]) for page in opened] == [("Tide pools", 200)] * len(notations)


@needs_chromium
@pytest.mark.parametrize(("scheme", "browser"), [("http", "own"), ("https", "own"), ("http", "the run's")])
def test_a_trusted_page_redirecting_to_another_loopback_origin_is_blocked_at_the_hop(site, other_site, scheme, browser):
    target = f"{scheme}://127.0.0.1:{port(other_site)}/article.html"

    async def scenario(endpoint):
        async with trusted_session(site, endpoint) as session:
            trusted = await call(session, "browser_navigate", url=f"{site.url}/article.html")
            return trusted, await call(session, "browser_navigate", url=f"{site.url}/redirect?to={target}")

    with runs_browser(site) if browser == "the run's" else contextlib.nullcontext() as endpoint:
        trusted, redirected = asyncio.run(scenario(endpoint))
    assert trusted["status"] == 200  # the trusted origin itself is reached, through the proxy
    assert redirected == {"error": "blocked: 127.0.0.1 is a loopback address"}
    assert f"/redirect?to={target}" in [path for _, path, _ in site.requests]
    assert other_site.requests == []


@needs_chromium
def test_a_page_sending_the_guards_header_is_read_as_a_page_not_as_a_refusal(site):
    """The refusal's reason comes from the guard, not from the body of a response that carries its header:
    a site can send the header too, with a body of any size, which would be read whole into the runner."""

    async def scenario():
        async with trusted_session(site) as session:
            return [await call(session, "browser_navigate", url=f"{site.url}/{page}") for page in PAGES]

    PAGES = ("fake-blocked.html", "article.html")
    fake, honest = asyncio.run(scenario())
    assert fake == honest | {"url": f"{site.url}/fake-blocked.html"}
    assert (honest["title"], honest["status"]) == ("Tide pools", 200)


@needs_chromium
def test_what_a_trusted_page_loads_from_another_loopback_origin_fails_to_load(site, other_site):
    async def scenario():
        async with trusted_session(site) as session:
            await call(session, "browser_navigate", url=f"{site.url}/article.html")
            page = (await session.resource("browser", None)).pages[-1]
            return await page.evaluate(
                """async ([own, other]) => {
                    const load = (src) => new Promise((done) => {
                        const image = new Image();
                        image.onload = () => done("loaded");
                        image.onerror = () => done("failed");
                        image.src = src;
                    });
                    const fetched = await fetch(other).then((r) => r.status, (e) => e.name);
                    return [await load(own), await load(other), fetched];
                }""",
                [f"{site.url}/image.png", f"{other_site.url}/image.png"],
            )

    assert asyncio.run(scenario()) == ["loaded", "failed", "TypeError"]
    assert other_site.requests == []


@needs_chromium
def test_a_redirect_from_a_public_host_to_the_metadata_service_is_refused_at_the_hop(site):
    """Chromium never resolves a name: the proxy does, here with a stand-in resolver, and connects to
    the public address it checked (the stand-in connection lands on the local site)."""
    proxy, connected = stand_in_proxy(site)

    async def scenario():
        browser = BrowserLauncher(CHROMIUM, guard=proxy)
        try:
            context = await browser.new_context()
            page = await context.new_page()
            response = await page.goto("http://public.test/redirect?to=http://metadata.test/latest/meta-data/")
            return response.status, response.headers.get(BLOCKED_HEADER.lower()), await response.text()
        finally:
            await browser.close()

    assert asyncio.run(scenario()) == (403, "1", METADATA_BLOCKED)
    assert connected == [(PUBLIC, 80)]
    assert [(path, headers["Host"]) for _, path, headers in site.requests] == [
        ("/redirect?to=http://metadata.test/latest/meta-data/", "public.test")
    ]


@needs_chromium
def test_a_page_cannot_send_webrtc_udp_to_a_loopback_address(site):
    """UDP does not go through the proxy: Chromium is started with WebRTC's non-proxied UDP off."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stun:
        stun.bind(("127.0.0.1", 0))
        stun.setblocking(False)

        async def scenario():
            async with trusted_session(site) as session:
                await call(session, "browser_navigate", url=f"{site.url}/article.html")
                page = (await session.resource("browser", None)).pages[-1]
                return await page.evaluate(
                    """async (port) => {
                        const peer = new RTCPeerConnection({iceServers: [{urls: `stun:127.0.0.1:${port}`}]});
                        peer.createDataChannel("probe");
                        const gathered = new Promise((done) => peer.onicegatheringstatechange = () =>
                            peer.iceGatheringState === "complete" && done("complete"));
                        await peer.setLocalDescription(await peer.createOffer());
                        return await Promise.race([gathered, new Promise((done) => setTimeout(done, 10000, "late"))]);
                    }""",
                    stun.getsockname()[1],
                )

        assert asyncio.run(scenario()) == "complete"  # every candidate it would try was tried
        with pytest.raises(BlockingIOError):
            stun.recv(2048)


def stand_in_proxy(site: LocalSite) -> tuple[GuardProxy, list[tuple[str, int]]]:
    """A proxy on a stand-in DNS whose connections to any address land on `site`; it lists where it connected."""
    connected = []

    async def resolver(host: str) -> list[str]:
        return STAND_IN_DNS[host]

    async def connect(address: str, target_port: int):
        connected.append((address, target_port))
        return await asyncio.open_connection("127.0.0.1", port(site))

    return GuardProxy(resolver, connect=connect), connected


async def exchange(proxy: GuardProxy, request: bytes, then: bytes = b"") -> bytes:
    """Send `request` to the proxy, then `then` once it answered; everything it sends until it closes."""
    host, port = (await proxy.start()).removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        answer = await reader.readuntil(b"\r\n\r\n")
        if then:
            writer.write(then)
        return answer + await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def through_proxy(site: LocalSite, request: bytes, then: bytes = b"") -> tuple[bytes, GuardProxy, list]:
    proxy, connected = stand_in_proxy(site)

    async def scenario():
        try:
            return await exchange(proxy, request, then)
        finally:
            await proxy.close()

    return asyncio.run(scenario()), proxy, connected


def test_the_proxy_passes_a_plain_request_to_the_checked_address_in_origin_form(site):
    request = (
        b"GET http://public.test/article.html?x=1 HTTP/1.1\r\nHost: public.test\r\nProxy-Connection: keep-alive\r\n\r\n"
    )
    answer, _, connected = through_proxy(site, request)
    assert answer.startswith(b"HTTP/1.0 200 OK") and b"Life in tide pools" in answer
    assert connected == [(PUBLIC, 80)]
    ((method, path, headers),) = site.requests
    assert (method, path, headers["Host"], headers["Connection"]) == (
        "GET",
        "/article.html?x=1",
        "public.test",
        "close",
    )
    assert "Proxy-Connection" not in headers


@pytest.mark.parametrize(
    "request_line",
    [b"GET http://metadata.test/latest/meta-data/ HTTP/1.1", b"CONNECT metadata.test:443 HTTP/1.1"],
)
def test_the_proxy_refuses_a_private_target_with_the_reason(site, request_line):
    answer, proxy, connected = through_proxy(site, request_line + b"\r\nHost: metadata.test\r\n\r\n")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 403 Forbidden") and f"{BLOCKED_HEADER}: 1".encode() in head
    assert body.decode() == METADATA_BLOCKED
    assert proxy.refusal("https://metadata.test/" if b"CONNECT" in request_line else "http://metadata.test/x")
    assert proxy.refusal("http://public.test/") is None
    assert connected == [] and site.requests == []


def test_one_private_address_of_a_name_blocks_it(site):
    answer, _, connected = through_proxy(site, b"CONNECT intranet.test:443 HTTP/1.1\r\n\r\n")
    assert answer.endswith(b"blocked: intranet.test resolves to 10.1.2.3, a private address")
    assert connected == []


def test_the_proxy_tunnels_a_connect_to_the_checked_address(site):
    tunnelled = b"GET /data.json HTTP/1.1\r\nHost: public.test\r\nConnection: close\r\n\r\n"
    answer, _, connected = through_proxy(site, b"CONNECT public.test:443 HTTP/1.1\r\n\r\n", then=tunnelled)
    assert answer.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.0 200 OK")
    assert answer.endswith(b'{"answer": 42}')
    assert connected == [(PUBLIC, 443)]


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"GET /article.html HTTP/1.1\r\nHost: public.test\r\n\r\n", b"400"),  # not a proxy request
        (b"GET ftp://public.test/ HTTP/1.1\r\n\r\n", b"400"),
        (b"CONNECT public.test HTTP/1.1\r\n\r\n", b"400"),
        (b"nonsense\r\n\r\n", b"400"),
        (b"GET http://public.test/ HTTP/1.1\r\nX: " + b"a" * HEADER_LIMIT + b"\r\n\r\n", b"431"),
    ],
)
def test_the_proxy_refuses_what_is_not_a_proxy_request(site, sent, status):
    answer, _, connected = through_proxy(site, sent)
    assert answer.startswith(b"HTTP/1.1 " + status)
    assert connected == []


def test_closing_the_proxy_drops_its_open_tunnels(site):
    proxy, _ = stand_in_proxy(site)

    async def scenario():
        host, port = (await proxy.start()).removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"CONNECT public.test:80 HTTP/1.1\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")  # the tunnel is open, idle
        await proxy.close()
        with contextlib.closing(writer):
            return await asyncio.wait_for(reader.read(), 10)

    assert asyncio.run(scenario()) == b""
