"""A web site on 127.0.0.1 for the web and browser tools: pages, redirects, a huge page, binary data, a
404, a request that hangs, a form, and search APIs speaking SearXNG's, Tavily's and Brave's JSON."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from trajforge.mock.model import solid_png

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


def _huge() -> bytes:
    paragraphs = "".join(
        f"<p>Paragraph {i}: the quick brown fox jumps over the lazy dog again.</p>" for i in range(60_000)
    )
    return f"<html><head><title>Huge</title></head><body>{paragraphs}</body></html>".encode()


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
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
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
            "/plain.txt": ("text/plain; charset=utf-8", b"Just some plain text.\nSecond line."),
            "/data.json": ("application/json", b'{"answer": 42}'),
            "/binary.bin": ("application/octet-stream", bytes(range(256)) * 64),
            "/image.png": ("image/png", solid_png(8, 8, b"\x10\x80\xf0")),
        }
        if path in pages:
            return self.send(handler, 200, *pages[path])
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

    def send(self, handler, status: int, content_type: str, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
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
