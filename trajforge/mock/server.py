"""A real OpenAI-compatible HTTP server on 127.0.0.1 for the scripted model (`trajforge.mock.model`).

`--model=mock` starts it as a subprocess; the tests run it in a thread with fault injection and read
its request log. It speaks just enough HTTP/1.1 (keep-alive, JSON bodies, server-sent events) for the
`openai` client, on plain asyncio so hundreds of open sessions cost next to nothing.

    python -m trajforge.mock.server --port 0 --latency 0.3     # prints MOCK_SERVER_URL=http://127.0.0.1:PORT/v1
    python -m trajforge.mock.server --max_in_flight 5          # a provider's concurrency limit: 429 beyond it
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import itertools
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from trajforge.mock import model as mock_model
from trajforge.mock import tokens as mock_tokens
from trajforge.mock.wire import ThreadedServer

CLIENT_GONE = 499  # logged for a request whose client hung up before its answer (nginx's "client closed request")
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}
TLS_HANDSHAKE = 0x16  # the first byte of a TLS ClientHello


class MockServer:
    def __init__(
        self,
        latency: float = 0.0,
        turns: int | None = None,
        api_key: str | None = None,
        record: bool = True,
        cost=mock_model.BY_TOKENS,
    ):
        self.latency = latency
        self.turns = turns
        self.api_key = api_key
        self.record = record
        self.cost = cost  # what every reply reports as usage.cost: BY_TOKENS, a USD amount, or None (none)
        # A provider's concurrency limit: a chat request beyond this many in flight is answered 429 at once,
        # with Retry-After: `busy_retry_after` seconds. None: no limit.
        self.max_in_flight: int | None = None
        self.busy_retry_after = 1.0
        self.in_flight = 0
        self.held: asyncio.Event | None = None  # while cleared, chat requests wait before their answer
        self.holds = 0  # holds begun so far: a request in flight when one begins is held by it
        self.dropping = False
        self.requests: list[dict] = []
        self.attempts: Counter[str] = Counter()
        self.sessions: Counter[str] = Counter()  # first-turn requests per prompt: sessions started
        self.port = 0
        # What GET /models lists; None: no such route (404), as on servers without it, so no model is refused.
        self.models: list[str] | None = None
        # A server without structured output: a request with `response_format` is refused with a 400.
        self.structured_output = True
        self._ids = itertools.count()
        self._served: ThreadedServer | None = None

    # -- running -------------------------------------------------------------------------------
    async def listen(self, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
        server = await asyncio.start_server(self._connection, host, port, backlog=1024)
        self.port = server.sockets[0].getsockname()[1]
        return server

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve from a background thread; returns the base URL."""
        self._served = ThreadedServer(self._connection)
        url = self._served.start(host, port)
        self.port = self._served.port
        return f"{url}/v1"

    def stop(self) -> None:
        if self._served:
            self._served.stop()

    def chat_requests(self) -> list[dict]:
        return [r for r in self.requests if r["path"].endswith("/chat/completions")]

    def hold(self) -> None:
        """Answer no chat request until release(): what is in flight now or arrives meanwhile stays
        unanswered (a test kills the client meanwhile, knowing which requests were answered)."""
        applied = threading.Event()  # in effect on the server's loop before this returns: no answer slips by

        def hold() -> None:
            self._hold()
            applied.set()

        self._served_call(hold)
        applied.wait(5)

    def _served_call(self, callback: Callable[[], object]) -> None:
        assert self._served is not None, "the server is not started"
        self._served.call_soon(callback)

    def _let_go(self) -> None:
        if self.held is not None:
            self.held.set()

    def _hold(self) -> None:
        self.held, self.dropping = asyncio.Event(), False
        self.holds += 1

    def _holding(self) -> bool:
        return self.held is not None and not self.held.is_set()

    def release(self, answer: bool = True) -> None:
        """Let held requests go on: answered, or (answer=False) dropped unanswered (logged with status
        CLIENT_GONE), as a server does whose client has gone. Held is every request that was in flight at
        some moment of the hold, also one still in its latency now: a killed client's last request, which
        came during the hold, dies with it whenever the test releases."""
        self.dropping = not answer
        self._served_call(self._let_go)

    # -- HTTP ----------------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.readexactly(1)
            if first[0] == TLS_HANDSHAKE:  # https:// to this plain-HTTP server: answer as HTTP servers do
                writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            while True:
                head = first + await reader.readuntil(b"\r\n\r\n")
                first = b""
                request_line, *lines = head.decode("latin-1").split("\r\n")
                method, target, _ = request_line.split(" ", 2)
                headers = {}
                for line in lines:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                if not await self._route(method, target.split("?")[0], headers, body, writer, reader):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str, headers: dict, body: bytes, writer, reader=None) -> bool:
        site = f"http://{headers.get('host') or f'127.0.0.1:{self.port}'}"
        if path == "/_mock/requests":
            return await self._send(writer, 200, self.requests)
        if method == "GET" and path == "/_mock/page":  # for web_extract and the browser, which send no key
            return await self._send_bytes(writer, 200, mock_model.PAGE.encode(), "text/html; charset=utf-8")
        if method == "GET" and path == "/_mock/image.png":
            return await self._send_bytes(writer, 200, mock_model.solid_png(64, 64, b"\x3c\x8c\xc8"), "image/png")
        if self.api_key and headers.get("authorization") != f"Bearer {self.api_key}":
            self._log(path, {}, 401)
            return await self._send(writer, 401, _error(401, "Invalid API key"))
        if path.endswith("/models") and self.models is not None:
            return await self._send(
                writer, 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]}
            )
        if method == "POST" and path.endswith("/chat/completions"):
            return await self._chat(json.loads(body or b"{}"), path, headers, writer, site, reader)
        if method == "POST" and path.endswith("/images/generations"):
            request = json.loads(body or b"{}")
            refused = await self._refuse_directives(writer, path, request, str(request.get("prompt") or ""))
            if refused is not None:
                return refused
            self._log(path, request, 200, str(request.get("prompt") or ""), time.time())
            return await self._send(writer, 200, mock_model.image_reply(request, site, self.cost))
        return await self._send(writer, 404, _error(404, f"no route for {method} {path}"))

    async def _chat(self, request: dict, path: str, headers: dict, writer, site: str, reader=None) -> bool:
        if self.max_in_flight is None:
            return await self._answer(request, path, headers, writer, site, reader)
        if self.in_flight >= self.max_in_flight:
            self._log(path, request, 429, mock_model.prompt_text(request.get("messages") or []), time.time())
            error = _error(429, f"more than {self.max_in_flight} requests in flight")
            return await self._send(writer, 429, error, {"Retry-After": f"{self.busy_retry_after:g}"})
        self.in_flight += 1
        try:
            return await self._answer(request, path, headers, writer, site, reader)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: dict, path: str, headers: dict, writer, site: str, reader=None) -> bool:
        arrived, holding, holds = time.time(), self._holding(), self.holds
        prompt = mock_model.prompt_text(request.get("messages") or [])
        refused = await self._refuse_directives(writer, path, request, prompt)
        if refused is not None:
            return refused
        attempt = self.attempts[prompt]
        self.attempts[prompt] += 1
        if mock_model.turn_of(request.get("messages") or []) == 0:
            self.sessions[prompt] += 1
        session = self.sessions[prompt] - 1
        reply, extra_latency = mock_model.reply(request, attempt, self.turns, site, session, self.cost)
        steer = mock_model.Directives.parse(prompt)
        if steer.echo_key:  # a hostile or careless server
            sent = f" (you sent {headers.get('authorization')})"
            reply.error += sent
            if isinstance(reply.message.get("content"), str):
                reply.message["content"] += sent
        delay = self.latency + extra_latency
        if delay:
            await asyncio.sleep(delay)
        held = holding or self.holds != holds  # a hold was on at some moment since it came
        if self.held is not None and not self.held.is_set():
            await self.held.wait()
        if (held and self.dropping) or (reader is not None and reader.at_eof()):  # the client hung up: no answer
            self._log(path, request, CLIENT_GONE, prompt, arrived)
            return False
        self._log(path, request, reply.status, prompt, arrived)
        if reply.trickle:
            writer = Trickle(writer, reply.trickle)
        if reply.endless:
            await _endless(writer, bool(request.get("stream")))
            return False
        if reply.bomb:
            bomb = gzip.compress(mock_model.zeros_gzip(512))
            return await self._send_bytes(writer, 200, bomb, "application/json", {"Content-Encoding": "gzip, gzip"})
        if reply.status != 200:
            body = reply.body if reply.body is not None else _error(reply.status, reply.error)
            return await self._send(writer, reply.status, body, reply.headers)
        completion: dict[str, Any] = {
            "id": f"chatcmpl-mock-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": steer.model or request.get("model", "mock"),
        }
        if steer.no_model:
            del completion["model"]
        ids = mock_tokens.asked(request) and not steer.no_token_ids and not reply.empty  # vLLM's return_token_ids
        if request.get("stream"):
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            await self._stream(writer, completion, reply, include_usage, request if ids else None)
            return False
        if reply.empty:
            return await self._send(writer, 200, completion)
        completion["choices"] = [{"index": 0, "message": reply.message, "finish_reason": reply.finish_reason}]
        if reply.finish_reason == "error":
            completion["choices"][0]["error"] = _error(502, reply.error)["error"]
        completion["usage"] = reply.usage
        if ids:
            mock_tokens.attach(completion, request, reply.message, steer.template == "drift", steer.ids)
        return await self._send_bytes(writer, 200, _hostile(completion, reply), "application/json")

    async def _refuse_directives(self, writer, path: str, request: dict, prompt: str) -> bool | None:
        """A 400 naming a directive the model does not know (a misspelt one would test nothing), else None."""
        try:
            mock_model.Directives.parse(prompt)
        except mock_model.DirectiveError as error:
            self._log(path, request, 400, prompt, time.time())
            return await self._send(writer, 400, _error(400, str(error)))
        if "response_format" in request and not self.structured_output:
            self._log(path, request, 400, prompt, time.time())
            return await self._send(writer, 400, _error(400, "response_format is not supported by this server"))
        return None

    def _log(self, path: str, request: dict, status: int, prompt: str = "", arrived: float = 0.0) -> None:
        """One answered request (`arrived`: when it came in, as time.time())."""
        if self.record:
            self.requests.append({"path": path, "prompt": prompt, "status": status, "body": request, "at": arrived})

    async def _send(self, writer, status: int, payload, headers: dict | None = None) -> bool:
        return await self._send_bytes(writer, status, json.dumps(payload).encode(), "application/json", headers)

    async def _send_bytes(
        self, writer, status: int, data: bytes, content_type: str, headers: dict | None = None
    ) -> bool:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\n{extra}Connection: keep-alive\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        return True

    async def _stream(
        self, writer, completion: dict, reply: mock_model.Reply, include_usage: bool, ids: dict | None = None
    ) -> None:
        """Server-sent events the way OpenAI streams: role, reasoning, content and tool-call deltas; with
        `ids` (the request, when it asked for token ids) each chunk carries its ids as vLLM's do."""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Connection: close\r\n\r\n"
        )

        chunks: list[dict] = []  # written together at the end, as before: one drain
        finishing: set[int] = set()

        def event(delta: dict, finish: str | None = None, **extra) -> None:
            chunk = dict(completion, object="chat.completion.chunk", **extra)
            chunk.setdefault("choices", [{"index": 0, "delta": delta, "finish_reason": finish}])
            if finish is not None:  # the last chunk with a choice carries a hostile reply's marks
                finishing.add(len(chunks))
            chunks.append(chunk)

        if reply.empty:
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
            return
        message = reply.message
        event({"role": "assistant", "content": ""})
        for key in ("reasoning", "reasoning_content"):
            for piece in _halves(message.get(key) or ""):
                event({key: piece})
        if message.get("reasoning_details"):
            event({"reasoning_details": message["reasoning_details"]})
        for piece in _halves(message.get("content") or ""):
            event({"content": piece})
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):  # a hostile reply (``calls_string``): sent as it is
            event({"tool_calls": calls})
        for index, call in enumerate(calls if isinstance(calls, list) else []):
            for piece in _call_pieces(index, call):
                event({"tool_calls": [piece]})
        event({}, reply.finish_reason)
        if include_usage:
            event({}, choices=[], usage=reply.usage)
        if ids is not None:
            steer = mock_model.Directives.parse(mock_model.prompt_text(ids.get("messages") or []))
            mock_tokens.spread(chunks, ids, message, steer.template == "drift", steer.ids)
        for position, chunk in enumerate(chunks):
            writer.write(b"data: " + _hostile(chunk, reply if position in finishing else None) + b"\n\n")
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


class Trickle:
    """A writer that sends what it is given one byte at a time, `interval` seconds apart."""

    def __init__(self, writer: asyncio.StreamWriter, interval: float):
        self._writer, self._interval, self._pending = writer, interval, b""

    def write(self, data: bytes) -> None:
        self._pending += data

    async def drain(self) -> None:
        pending, self._pending = self._pending, b""
        for i in range(len(pending)):
            self._writer.write(pending[i : i + 1])
            await self._writer.drain()
            await asyncio.sleep(self._interval)


async def _endless(writer, stream: bool) -> None:
    """A 200 whose body never ends: keep-alive comments on a stream, spaces (JSON allows them) in a
    plain body, until the client hangs up."""
    kind = b"text/event-stream" if stream else b"application/json"
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nConnection: close\r\n\r\n")
    while True:
        writer.write(b": keep-alive\n\n" if stream else b" ")
        await writer.drain()
        await asyncio.sleep(0.05)


def _hostile(payload: dict, reply: mock_model.Reply | None) -> bytes:
    """`payload` as JSON, with what no encoder would write that `reply` asks for: a field nested
    `reply.deep` levels, a byte that is not UTF-8."""
    if reply is None or not (reply.deep or reply.bad_utf8):
        return json.dumps(payload).encode()
    marks = {"x_deep": mock_model.DEEP} if reply.deep else {}
    marks |= {"x_bad": mock_model.BAD_BYTE} if reply.bad_utf8 else {}
    data = json.dumps(payload | marks).encode()
    data = data.replace(b'"' + mock_model.DEEP.encode() + b'"', b"[" * reply.deep + b"]" * reply.deep)
    return data.replace(mock_model.BAD_BYTE.encode(), b"\xff")


def _call_pieces(index: int, call) -> list:
    """The stream pieces of one tool call: its id and name, then its arguments in halves. A malformed
    call (hostile directives) goes out as malformed as it is."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return [call]
    head = {"index": index, "id": call["id"], "type": "function"} if "id" in call else {"index": index}
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    pieces = [dict(head, function={"name": name, "arguments": ""})]
    parts = _halves(arguments) if isinstance(arguments, str) else [arguments]
    return pieces + [{"index": index, "function": {"arguments": part}} for part in parts]


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


def _error(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "mock_error", "code": status}}


def _cost(text: str):
    """--cost: `tokens` (a made-up price per token), an amount in USD, or `none` (no cost reported)."""
    if text in (mock_model.BY_TOKENS, "none"):
        return None if text == "none" else text
    return float(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--turns", type=int, default=None, help="tool-calling turns before the answer")
    parser.add_argument("--api_key", default=None, help="require this bearer token")
    parser.add_argument("--record", action="store_true", help="keep a request log at /_mock/requests")
    parser.add_argument("--exit_with_stdin", action="store_true", help="exit when standard input closes")
    parser.add_argument("--cost", type=_cost, default=mock_model.BY_TOKENS, help="usage.cost: tokens, USD or none")
    parser.add_argument("--max_in_flight", type=int, default=None, help="answer 429 to chat requests beyond this many")
    parser.add_argument("--busy_retry_after", type=float, default=1.0, help="the Retry-After of those 429s")
    args = parser.parse_args(argv)
    server = MockServer(args.latency, args.turns, args.api_key, args.record, args.cost)
    server.max_in_flight, server.busy_retry_after = args.max_in_flight, args.busy_retry_after

    async def serve() -> None:
        listening = await server.listen(args.host, args.port)
        print(f"MOCK_SERVER_URL=http://{args.host}:{server.port}/v1", flush=True)
        async with listening:
            await listening.serve_forever()

    if args.exit_with_stdin:
        # The runner holds our stdin; when it dies, even by SIGKILL, the pipe closes and we follow.
        threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
