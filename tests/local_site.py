"""A web site on 127.0.0.1 for the web and browser tools: pages, redirects, a huge page, binary data, a
404, a request that hangs, a form, search APIs speaking SearXNG's, Tavily's and Brave's JSON, pages sent
compressed, and decompression bombs (a few KB on the wire, hundreds of MB decoded)."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from trajforge.mock.model import solid_png, zeros_gzip

SEARCH_KEY = "search-key-for-tests"
HANG_SECONDS = 10  # longer than any test's fetch timeout; bounded so the server always stops

ARTICLE = """<!doctype html><html><head><title>Tide pools</title></head><body>
<nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<article><h1>Life in tide pools</h1>
<p>Tide pools are rocky hollows on the shore that keep sea water when the tide goes out.</p>
<p>Anemones, sea stars and small crabs live there and survive the changes of temperature and salt
between two tides. The pools are a favourite place of marine biologists.</p>
<p>Visitors should look but not touch, and never take animals home.</p>
</article><footer>Copyright notice of the example site</footer></body></html>"""

FORM = """<!doctype html><html><head><title>Greeter</title></head><body>
<h1>Greeter</h1><p>Tell us your name.</p>
<form action="/form.html" method="get"><label for="name">Your name</label> <input id="name" name="name">
<button type="submit">Greet me</button></form>
<a href="/article.html">Read about tide pools</a>
<p id="greeting"></p>
<script>
const name = new URLSearchParams(location.search).get("name");
if (name) document.getElementById("greeting").textContent = `Hello, ${name}!`;
</script></body></html>"""


# One table row of 20,000 cells (200 KB): trafilatura's time grows with the square of it (~10 s here, about
# 40 minutes at web_extract's 2 MB cap).
WIDE_ROW = b"<html><body><table><tr>" + b"<td>a</td>" * 20_000 + b"</tr></table></body></html>"


def _huge() -> bytes:
    paragraphs = "".join(
        f"<p>Paragraph {i}: the quick brown fox jumps over the lazy dog again.</p>" for i in range(60_000)
    )
    return f"<html><head><title>Huge</title></head><body>{paragraphs}</body></html>".encode()


def _deflated(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


BOMB_MB = 512  # what a bomb decodes to


class LocalSite:
    def __init__(self):
        self.requests: list[tuple[str, str, dict]] = []  # (method, path with query, headers)
        self.stopping = threading.Event()
        self.huge = _huge()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep the test output clean
                pass

            def do_GET(self) -> None:
                site.route(self, "GET")

            def do_POST(self) -> None:
                site.route(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LocalSite:
        # Its loop looks for shutdown() every 50 ms, not serve_forever's 500: a test's own site stops at once.
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def route(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        self.requests.append((method, handler.path, dict(handler.headers)))
        parts = urlsplit(handler.path)
        query = {key: values[0] for key, values in parse_qs(parts.query).items()}
        path = parts.path
        pages = {
            "/article.html": ("text/html; charset=utf-8", ARTICLE.encode()),
            "/form.html": ("text/html; charset=utf-8", FORM.encode()),
            "/huge.html": ("text/html", self.huge),
            "/wide-row.html": ("text/html", WIDE_ROW),
            "/plain.txt": ("text/plain; charset=utf-8", b"Just some plain text.\nSecond line."),
            "/data.json": ("application/json", b'{"answer": 42}'),
            "/binary.bin": ("application/octet-stream", bytes(range(256)) * 64),
            "/image.png": ("image/png", solid_png(8, 8, b"\x10\x80\xf0")),
        }
        if path in pages:
            return self.send(handler, 200, *pages[path])
        if path.startswith("/encoded/"):  # /encoded/ENCODING/PAGE: a page sent compressed
            _, _, encoding, page = path.split("/", 3)
            content_type, body = pages[f"/{page}"]
            encoded = {"Content-Encoding": encoding.split("+")[0]}
            return self.send(handler, 200, content_type, self.encode(encoding, body), encoded)
        if path.startswith("/bomb/"):  # /bomb/gzip, /bomb/gzip,gzip (and /bomb/gzip,gzip/search: a search API)
            layers = path.split("/")[2].split(",")
            body = zeros_gzip(BOMB_MB)
            for _ in layers[1:]:
                body = gzip.compress(body)
            return self.send(handler, 200, "text/html", body, {"Content-Encoding": ", ".join(layers)})
        if path == "/fake-blocked.html":  # a page that claims to be the browser guard's refusal
            return self.send(handler, 200, "text/html", ARTICLE.encode(), {"X-Trajforge-Blocked": "1"})
        if path == "/redirect":  # ?to=URL: anywhere, e.g. another host
            return self.redirect(handler, query.get("to", "/article.html"))
        if path.startswith("/chain/"):
            left = int(path.rsplit("/", 1)[1])
            return self.redirect(handler, f"/chain/{left - 1}" if left else "/article.html")
        if path == "/loop":
            return self.redirect(handler, "/loop")
        if path == "/hang":
            self.stopping.wait(HANG_SECONDS)
            return None
        if path == "/search":
            return self.searxng(handler, query)
        if path == "/nojson/search":  # a SearXNG whose json format is not enabled
            return self.send(handler, 403, "text/html", b"Forbidden")
        if path == "/tavily" and method == "POST":
            return self.tavily(handler)
        if path == "/brave":
            return self.brave(handler, query)
        return self.send(handler, 404, "text/html", b"<h1>Not found</h1>")

    @staticmethod
    def encode(encoding: str, body: bytes) -> bytes:
        """`body` as ENCODING: gzip, deflate (zlib's format), deflate+raw (without zlib's header, as some
        servers send it), br (not brotli really: no client here asks for it)."""
        wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "deflate+raw": -zlib.MAX_WBITS}
        return _deflated(body, wbits[encoding]) if encoding in wbits else body

    def send(self, handler, status: int, content_type: str, body: bytes, headers: dict | None = None) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def send_json(self, handler, status: int, payload) -> None:
        self.send(handler, status, "application/json", json.dumps(payload).encode())

    def redirect(self, handler, location: str) -> None:
        handler.send_response(302)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def results(self, query: str) -> list[tuple[str, str, str]]:
        return [
            (f"Result {i} for {query}", f"{self.url}/article.html?r={i}", f"Snippet {i} about {query}")
            for i in range(8)
        ]

    def searxng(self, handler, query: dict) -> None:
        rows = [{"title": t, "url": u, "content": c, "engine": "test"} for t, u, c in self.results(query.get("q", ""))]
        return self.send_json(handler, 200, {"query": query.get("q"), "results": rows})

    def tavily(self, handler) -> None:
        if handler.headers.get("Authorization") != f"Bearer {SEARCH_KEY}":
            return self.send_json(handler, 401, {"detail": {"error": "Unauthorized: missing or invalid API key."}})
        body = json.loads(handler.rfile.read(int(handler.headers.get("Content-Length") or 0)))
        rows = [{"title": t, "url": u, "content": c, "score": 0.9} for t, u, c in self.results(body["query"])]
        return self.send_json(handler, 200, {"query": body["query"], "results": rows[: body.get("max_results", 5)]})

    def brave(self, handler, query: dict) -> None:
        if handler.headers.get("X-Subscription-Token") != SEARCH_KEY:
            return self.send_json(handler, 401, {"error": {"code": "SUBSCRIPTION_TOKEN_INVALID"}})
        rows = [{"title": t, "url": u, "description": c} for t, u, c in self.results(query.get("q", ""))]
        return self.send_json(handler, 200, {"type": "search", "web": {"results": rows[: int(query.get("count", 5))]}})
