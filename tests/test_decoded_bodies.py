"""Bodies sent compressed: honest pages read as they are, decompression bombs (a few KB on the wire,
hundreds of MB decoded, once or twice compressed) end within the cap, the deadline and bounded memory,
against the local site (tests/local_site.py) and local search APIs."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import httpx
import pytest
from local_site import BOMB_MB
from test_web_tools import extract, search

from trajforge.mock.model import zeros_gzip
from trajforge.model.client import endpoint_problem
from trajforge.model.settings import ModelSettings
from trajforge.tools.decoded import STEP, Undecodable, read_decoded
from trajforge.tools.search_providers import SearchProvider

CAP = 2_000_000  # ToolSettings.fetch_max_bytes
TESTS = Path(__file__).parent


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate+raw"])
def test_a_page_sent_compressed_reads_as_the_plain_page(site, encoding):
    (plain,) = extract([f"{site.url}/article.html"])["results"]
    (compressed,) = extract([f"{site.url}/encoded/{encoding}/article.html"])["results"]
    assert "Anemones, sea stars and small crabs live there" in compressed["content"]
    assert (compressed["title"], compressed["content"], compressed["truncated"]) == (
        plain["title"],
        plain["content"],
        False,
    )
    assert site.requests[-1][2]["Accept-Encoding"] == "gzip, deflate"  # what the reader decodes, no more


def test_a_page_compressed_twice_or_in_an_encoding_not_asked_for_is_a_tool_error(site):
    result = extract([f"{site.url}/bomb/gzip,gzip", f"{site.url}/encoded/br/article.html"])
    twice, brotli = result["results"]
    assert twice["error"] == f"{site.url}/bomb/gzip,gzip: the body is encoded 2 times (gzip, gzip): not decoded"
    assert brotli["error"] == (
        f"{site.url}/encoded/br/article.html: the body is encoded with 'br', which was not asked for: not decoded"
    )
    assert "error" in result  # no page came back: the call counts as a failure


def test_a_page_that_decodes_past_the_cap_is_cut_there_like_a_huge_page(site):
    (page,) = extract([f"{site.url}/bomb/gzip"])["results"]
    assert page["truncated"] is True
    assert page["content"].endswith(f"[... the page is larger than {CAP} bytes; only its start was read ...]")


PROBE = """
import asyncio, json, resource, sys, time
from local_site import LocalSite
from trajforge.tools.fetch import FetchError, fetch, http_client

async def main(paths):
    with LocalSite() as site:
        client = http_client(allow_private=True)
        await fetch(client, site.url + "/article.html", max_bytes=%(cap)d, timeout=20, accept=lambda t: True)
        for path in paths:
            gaps = [0.0]
            async def ticker():
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.005)
                    gaps.append(time.monotonic() - last)
                    last = time.monotonic()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0.02)
            started = time.monotonic()
            try:
                page = await fetch(client, site.url + path, max_bytes=%(cap)d, timeout=20, accept=lambda t: True)
                outcome = [len(page.body), page.truncated]
            except FetchError as exc:
                outcome = str(exc)
            seconds = time.monotonic() - started
            tick.cancel()
            grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
            print(json.dumps({"outcome": outcome, "seconds": seconds, "grown_mb": grown, "stalled": max(gaps)}))
        await client.aclose()

asyncio.run(main(sys.argv[1:]))
"""


def test_a_bomb_takes_no_more_memory_than_the_cap_and_never_stalls_the_event_loop():
    """In a process of its own, whose peak memory is its own: each fetch's growth of the peak, its time,
    and the longest pause of a task ticking every 5 ms beside it. Before the fix, the single bomb grew the
    peak by 126 MB and stalled the loop for 0.25 s, the double one by 900 MB in 3 s."""
    paths = ["/encoded/gzip/huge.html", "/bomb/gzip", "/bomb/gzip,gzip"]
    probe = subprocess.run(
        [sys.executable, "-c", PROBE % {"cap": CAP}, *paths],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TESTS.parent,
        env=os.environ | {"PYTHONPATH": f"{TESTS.parent}{os.pathsep}{TESTS}"},
    )
    assert probe.returncode == 0, probe.stderr
    honest, bomb, double = map(json.loads, probe.stdout.splitlines())
    assert honest["outcome"] == [CAP, True]  # an honest page larger than the cap: cut there
    assert bomb["outcome"] == [CAP, True]
    assert double["outcome"].endswith("the body is encoded 2 times (gzip, gzip): not decoded")
    for fetched in (honest, bomb, double):
        assert fetched["grown_mb"] < 40, fetched  # the cap (2 MB) and its copies, not the bomb's 512 MB
        assert fetched["seconds"] < 10, fetched
        assert fetched["stalled"] < 0.2, fetched


def test_a_search_answer_is_read_decoded_up_to_the_cap(site):
    double = search(SearchProvider("searxng", f"{site.url}/bomb/gzip,gzip/search"), query="x")
    assert double["error"] == "SearchError: searxng: the body is encoded 2 times (gzip, gzip): not decoded"
    single = search(SearchProvider("searxng", f"{site.url}/bomb/gzip/search"), query="x")
    assert single["error"] == f"SearchError: searxng answered more than {CAP} bytes: not read"


def _read(body: bytes, encoding: str, limit: int, pieces: int = 1) -> tuple[bytes, bool]:
    size = -(-len(body) // pieces) or 1
    stream = httpx.ByteStream(body) if pieces == 1 else _Pieces([body[i : i + size] for i in range(0, len(body), size)])
    response = httpx.Response(200, headers={"Content-Encoding": encoding} if encoding else {}, stream=stream)
    return asyncio.run(read_decoded(response, limit))


class _Pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    async def __aiter__(self):
        for piece in self.pieces:
            yield piece


def test_the_reader_decodes_in_any_pieces_and_cuts_exactly_at_the_cap():
    text = os.urandom(3 * STEP).hex().encode()  # barely compressible: many decoding steps
    for encoding, body in [("", text), ("gzip", gzip.compress(text)), ("identity, gzip", gzip.compress(text))]:
        for pieces in (1, 7):
            assert _read(body, encoding, len(text), pieces) == (text, False)
            assert _read(body, encoding, len(text) - 1, pieces) == (text[:-1], True)
    deflated = zlib.compress(b"\0" * (5 * STEP))  # whole steps of output from little input: none is left in zlib
    assert _read(deflated, "deflate", 10 * STEP) == (b"\0" * (5 * STEP), False)
    bomb = zeros_gzip(BOMB_MB)
    assert _read(bomb, "gzip", 100, pieces=40) == (b"\0" * 100, True)


def test_the_reader_refuses_what_is_not_valid_in_its_encoding():
    with pytest.raises(Undecodable, match="the body is not valid gzip data"):
        _read(b"not gzip at all", "gzip", 100)
    with pytest.raises(Undecodable, match="encoded with 'compress'"):
        _read(b"", "compress", 100)


def test_the_endpoint_check_refuses_a_models_list_compressed_twice_unread(site, server):
    """GET /models goes through the model client's size limit too: a compressed answer is refused by its
    headers, never decoded, while the scripted server's plain list is read."""
    bombed = ModelSettings(model="test-model", base_url=f"{site.url}/bomb/gzip,gzip/v1", api_key="k")
    assert endpoint_problem(bombed) == (
        "connection error: reply compressed with 'gzip, gzip' although the request asked for none",
        None,
    )
    honest = ModelSettings(model="test-model", base_url=server.base_url, api_key="k")
    assert endpoint_problem(honest)[0] is None
