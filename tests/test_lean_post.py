"""The model client's lean POST (trajforge/model/post.py) against openai's own post, side by side on one
raw HTTP server on 127.0.0.1: the same request bytes on the wire (headers, their case and order, the
body, the URL under a path prefix), and for every reply the same result or the same exception (type,
message, status, body, headers, cause chain, and so the same retry decision and failure message).
What the lean path leaves to openai (a redirect, cookies the server set) goes through openai and ends
as openai ends it."""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import pytest

from trajforge.model.client import ModelClient
from trajforge.model.post import LeanPost, ThroughOpenAI
from trajforge.model.reply_body import decode
from trajforge.model.retry import classify, failure_message
from trajforge.model.settings import ModelSettings

BODY = {"model": "m", "messages": [{"role": "user", "content": "héllo \u2028 wörld"}], "temperature": 0.5}
JSON = b'{"choices":[{"message":{"role":"assistant","content":"hi"}}]}'


def reply(status: int, body: bytes = b"", *headers: str, length: bool = True) -> bytes:
    head = [f"HTTP/1.1 {status} X", *headers] + ([f"Content-Length: {len(body)}"] if length else [])
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(body: bytes) -> bytes:
    pieces = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7))
    return reply(200, pieces + b"0\r\n\r\n", "Transfer-Encoding: chunked", length=False)


REPLIES = {
    "ok": reply(200, JSON, "Content-Type: application/json"),
    "chunked": chunked(JSON),
    "rate_limited": reply(
        429, b'{"error":{"message":"slow down","code":429}}', "Retry-After: 7", "Retry-After-Ms: 6500"
    ),
    "html_502": reply(502, b"<html><body>Bad gateway</body></html>", "Content-Type: text/html"),
    "empty_400": reply(400),
    "text_500": reply(500, b"  overloaded, try later \n"),
    "overflow_400": reply(400, b'{"error":{"message":"maximum context length is 4096 tokens"}}'),
    "refused_401": reply(401, b'{"error":{"message":"bad key"}}'),
    "created_201": reply(201, JSON),
    "redirect_no_location_300": reply(300, b"choose"),
    "gzip": reply(200, gzip.compress(JSON), "Content-Encoding: gzip"),
    "announced_huge": reply(200, b"", "Content-Length: 999999999", length=False),
    "cut_off": reply(200, b"", "Content-Length: 100", length=False) + b'{"choices":',
    "reset": b"",
    "not_json": reply(200, b"<html>not json</html>"),
}


class Server:
    """Answers each request by the last part of its path (REPLIES), and keeps every request's bytes."""

    def __init__(self):
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                self.requests.append(head + await reader.readexactly(length))
                name = head.split(b" ")[1].decode().rsplit("/", 1)[1]
                if name == "silent":
                    await asyncio.sleep(30)
                if name == "moved":
                    writer.write(reply(307, b"", "Location: /v1/ok"))
                elif name == "cookie":
                    writer.write(reply(200, JSON, "Set-Cookie: session=abc; Path=/"))
                else:
                    writer.write(REPLIES[name])
                await writer.drain()
                if name in ("cut_off", "reset", "announced_huge"):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def client(port: int, prefix: str = "/v1", timeout: float = 30) -> ModelClient:
    base = f"http://127.0.0.1:{port}{prefix}"
    return ModelClient(ModelSettings(model="m", base_url=base, api_key="sk-test", request_timeout=timeout))


async def outcome(send) -> tuple:
    """What a send came to, in every way the retry policy, the ledger and errors.jsonl can tell."""
    try:
        return ("ok", bytes(await send()))
    except Exception as exc:
        chain, cause = [], exc
        while cause is not None:
            chain.append((type(cause), str(cause)))
            cause = cause.__cause__
        decision = classify(exc)
        status = getattr(exc, "status_code", None)
        headers = dict(exc.response.headers) if status else None
        return (
            "raised",
            chain,
            getattr(exc, "body", None),
            status,
            headers,
            decision,
            failure_message(exc, decision.kind),
        )


def both(name: str, prefix: str = "/v1", timeout: float = 30) -> tuple[tuple, tuple, list[bytes]]:
    """(openai's outcome, the lean one's, the requests the server got: openai's first) of POST BODY to /`name`."""

    async def main():
        server = Server()
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        model = client(port, prefix, timeout)
        try:
            theirs = await outcome(lambda: _content(model.client.post(f"/{name}", body=BODY, cast_to=httpx.Response)))
            ours = await outcome(lambda: LeanPost(model.client)(f"/{name}", BODY))
        finally:
            await model.close()
            listening.close()
        return theirs, ours, server.requests

    return asyncio.run(main())


async def _content(response) -> bytes:
    return (await response).content


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_every_reply_ends_as_openais_post_ends_it(name):
    theirs, ours, requests = both(name)
    assert ours == theirs
    assert len(requests) == 2 and requests[0] == requests[1]


def test_a_plain_reply_is_read_and_the_request_bytes_are_openais_under_a_path_prefix():
    theirs, ours, requests = both("ok", prefix="/proxy/openai/v1/")
    assert ours == theirs == ("ok", JSON)
    assert requests[0] == requests[1]
    assert requests[0].startswith(b"POST /proxy/openai/v1/ok HTTP/1.1\r\n")
    assert b"\r\nauthorization: Bearer sk-test\r\n" in requests[0]
    assert b"\r\naccept-encoding: identity\r\n" in requests[0]
    assert requests[0].endswith(json.dumps(BODY, ensure_ascii=False, separators=(",", ":")).encode())


def test_a_silent_server_times_out_as_openai_says_it():
    theirs, ours, _ = both("silent", timeout=0.5)
    assert theirs[0] == "raised" and classify_kind(theirs) == "timeout"
    assert ours == theirs


def test_a_refused_connection_fails_as_openai_fails_it():
    async def main():
        model = client(9)  # the discard port: nothing listens on 127.0.0.1
        try:
            theirs = await outcome(lambda: _content(model.client.post("/ok", body=BODY, cast_to=httpx.Response)))
            ours = await outcome(lambda: LeanPost(model.client)("/ok", BODY))
        finally:
            await model.close()
        return theirs, ours

    theirs, ours = asyncio.run(main())
    assert classify_kind(theirs) == "connection_refused"
    assert ours == theirs


def classify_kind(result: tuple) -> str:
    return result[5].kind


def test_a_redirect_and_a_cookie_go_through_openai_and_end_as_before():
    """The lean path sends neither: a redirect is sent again through openai, which follows it; after a
    cookie the server set, every request goes through openai, which sends it back."""

    async def main():
        server = Server()
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        model = client(listening.sockets[0].getsockname()[1])
        lean = LeanPost(model.client)
        try:
            with pytest.raises(ThroughOpenAI):
                await lean("/moved", BODY)
            moved = await model.post_json("/moved", BODY)
            assert await lean("/ok", BODY) == JSON  # no cookie yet: the lean path
            cookie = await model.post_json("/cookie", BODY)
            with pytest.raises(ThroughOpenAI):
                await lean("/ok", BODY)
            after = await model.post_json("/ok", BODY)
        finally:
            await model.close()
            listening.close()
        return server.requests, (moved, cookie, after)

    requests, replies = asyncio.run(main())
    assert all(found == decode(JSON) for found in replies)
    paths = [request.split(b" ")[1] for request in requests]
    # the lean try, post_json's lean try and openai's send of /moved, openai following it; a lean /ok
    assert paths == [b"/v1/moved"] * 3 + [b"/v1/ok", b"/v1/ok", b"/v1/cookie", b"/v1/ok"]
    assert b"cookie:" not in requests[4].lower()
    assert b"\r\ncookie: session=abc\r\n" in requests[-1].lower()
