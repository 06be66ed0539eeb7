"""A hostile streamable-HTTP MCP server for tests/test_mcp.py, written raw (the SDK sends nothing of this):
it answers initialize and tools/list as a server should, and its tools answer tools/call with

    echo       an honest reply: the text it was given
    flood      a JSON body that never ends (no length; the connection closes only when the client does)
    huge       a JSON body of 20 MB, its length said
    silent     an event stream that never ends and never answers: a keep-alive comment every 0.2 s
    big_event  an event stream whose one event never ends
    bomb       a JSON body of 100 MB gzip-compressed to a few hundred KB

    python flood_server.py SENT_LOG [huge_list]

prints its port, then serves http://127.0.0.1:PORT/mcp. With huge_list, tools/list is a body that never
ends. Each flood appends "TOOL BYTES" to SENT_LOG: how much of it the client took before it hung up.
"""

import itertools
import json
import sys
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOLS = ["echo", "flood", "huge", "silent", "big_event", "bomb"]
CHUNK = b"x" * 65536
MOST = 2 << 30  # bytes a flood sends at the most, so that a client that never stops reading cannot run forever


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # no stream of the server's own
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in message or "method" not in message:  # a notification, or the client's answer
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        method, ident = message["method"], message["id"]
        if method == "initialize":
            version = message["params"]["protocolVersion"]
            info = {"name": "flood", "version": "1"}
            self.reply(ident, {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info})
        elif method == "tools/list" and HUGE_LIST:
            self.flood("tools/list", ident)
        elif method == "tools/list":
            schema = {"type": "object", "properties": {"text": {"type": "string"}}}
            tools = [{"name": name, "description": f"{name} tool", "inputSchema": schema} for name in TOOLS]
            self.reply(ident, {"tools": tools})
        elif method == "tools/call":
            name, arguments = message["params"]["name"], message["params"].get("arguments") or {}
            if name == "echo":
                self.reply(ident, {"content": [{"type": "text", "text": f"echo: {arguments.get('text', '')}"}]})
            else:
                getattr(self, name)(name, ident)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def reply(self, ident, result: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def start(self, kind: str, length: int | None = None, encoding: str | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        if length is None:
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def pour(self, name: str, head: bytes, chunks, tail: bytes = b"") -> None:
        """Write head, chunks and tail while the client reads; log how much it took."""
        sent = 0
        try:
            for chunk in itertools.chain([head], chunks, [tail]):
                self.wfile.write(chunk)
                sent += len(chunk)
        except OSError:  # the client hung up
            pass
        finally:
            with open(SENT_LOG, "a") as log:
                log.write(f"{name} {sent}\n")
        self.close_connection = True

    def text_head(self, ident) -> bytes:
        return (
            b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "'
            % json.dumps(ident).encode()
        )

    def flood(self, name: str, ident) -> None:
        self.start("application/json")
        self.pour(name, self.text_head(ident), (CHUNK for _ in range(MOST // len(CHUNK))))

    def huge(self, name: str, ident) -> None:
        head, count, tail = self.text_head(ident), 320, b'"}]}}'
        self.start("application/json", len(head) + count * len(CHUNK) + len(tail))
        self.pour(name, head, (CHUNK for _ in range(count)), tail)

    def silent(self, name: str, ident) -> None:
        self.start("text/event-stream")

        def pings():
            for _ in range(600):
                time.sleep(0.2)
                yield b": ping\n\n"

        self.pour(name, b"", pings())

    def big_event(self, name: str, ident) -> None:
        self.start("text/event-stream")
        self.pour(name, b"event: message\ndata: " + self.text_head(ident), (CHUNK for _ in range(MOST // len(CHUNK))))

    def bomb(self, name: str, ident) -> None:
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
        parts = [packer.compress(self.text_head(ident))]
        parts += [packer.compress(CHUNK) for _ in range(1600)]  # 100 MB
        parts.append(packer.compress(b'"}]}}') + packer.flush())
        body = b"".join(parts)
        self.start("application/json", len(body), "gzip")
        self.pour(name, body, ())


if __name__ == "__main__":
    SENT_LOG = sys.argv[1]
    HUGE_LIST = sys.argv[2:] == ["huge_list"]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()
