"""Serves recorded HTTP exchanges again, byte for byte: the fixtures of a real llama.cpp server that
bench/record_llama.py recorded, for the tests to run the real runner against.

An incoming request is matched to a recorded one by method, path and body. The body is compared as
JSON with one thing blanked on both sides: the `content` of `tool` messages, which is what the tools
printed on the machine that ran them (workspace paths, file listings, dates), not something the runner
decides. Everything else the runner sends (model, messages, tool schemas, max_tokens, stream options)
must be identical. The recorded response goes out as it came: status line and headers unchanged, a
chunked body chunk by chunk. A request recorded once and asked again (a retry) gets the same answer
again. A request that matches nothing gets a loud 599 whose body holds the diff against the closest
recorded request, and is kept in `unmatched`, so a test fails saying what changed.

    python -m trajforge.mock.replay tests/fixtures/llama_cpp/plain_tool_calls.json --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from trajforge.mock.wire import Exchange, Response, ThreadedServer, WireError, read_request, write_response

TOOL_RESULT = "<tool result: not compared>"
UNMATCHED = 599


def load_fixture(path: Path) -> tuple[dict, list[Exchange]]:
    """(the fixture as stored, its exchanges)."""
    fixture = json.loads(Path(path).read_text(encoding="utf-8"))
    return fixture, [Exchange.from_json(item) for item in fixture["exchanges"]]


def runner_flags(fixture: dict, url: str, folder: Path) -> list[str]:
    """The batch_runner flags a fixture was recorded with, aimed at the server at `url` (its prefill
    messages, if any, written to a file in `folder`); the dataset is `fixture["runner"]["prompts"]`."""
    runner = fixture["runner"]
    flags = [*runner["flags"], f"--base_url={url}/v1"]
    if runner.get("prefill"):
        prefill = Path(folder) / "prefill.json"
        prefill.write_text(json.dumps(runner["prefill"], indent=1))
        flags.append(f"--prefill_messages_file={prefill}")
    return flags


def normalized(body):
    """`body` as the match compares it: tool messages' content blanked (see the module's doc)."""
    if not (isinstance(body, dict) and isinstance(body.get("messages"), list)):
        return body
    messages = [
        dict(m, content=TOOL_RESULT) if isinstance(m, dict) and m.get("role") == "tool" else m for m in body["messages"]
    ]
    return dict(body, messages=messages)


def _key(method: str, path: str, body) -> str:
    return json.dumps([method, path, normalized(body)], sort_keys=True, ensure_ascii=False)


@dataclass
class Served:
    """One request the replay server received: which recorded exchange answered it (None: none)."""

    method: str
    path: str
    body: object
    exchange: int | None
    status: int
    diff: str = ""


class ReplayServer:
    def __init__(self, exchanges: list[Exchange]):
        self.exchanges = exchanges
        self.log: list[Served] = []
        self._by_key: dict[str, list[int]] = defaultdict(list)
        for index, exchange in enumerate(exchanges):
            self._by_key[_key(exchange.method, exchange.path, exchange.body)].append(index)
        self._asked: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()  # the log is read from the test's thread
        self._server = ThreadedServer(self._connection)

    def start(self, port: int = 0) -> str:
        """Serve from a background thread (on a free port by default); returns http://127.0.0.1:PORT."""
        return self._server.start(port=port)

    def stop(self) -> None:
        self._server.stop()

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def unmatched(self) -> list[Served]:
        with self._lock:
            return [served for served in self.log if served.exchange is None]

    def served(self) -> list[Served]:
        with self._lock:
            return list(self.log)

    def answer(self, method: str, path: str, body) -> Served:
        """The recorded exchange for this request (the next one not yet served among identical ones,
        else the last again), or an unmatched entry with the diff."""
        key = _key(method, path, body)
        with self._lock:
            candidates = self._by_key.get(key)
            if candidates:
                index = candidates[min(self._asked[key], len(candidates) - 1)]
                self._asked[key] += 1
                served = Served(method, path, body, index, self.exchanges[index].response.status)
            else:
                served = Served(method, path, body, None, UNMATCHED, self._diff(method, path, body))
            self.log.append(served)
        return served

    def _diff(self, method: str, path: str, body) -> str:
        """A unified diff against the most similar recorded request of the same method and path."""
        received = _pretty(normalized(body))
        recorded = [_pretty(normalized(e.body)) for e in self.exchanges if (e.method, e.path) == (method, path)]
        if not recorded:
            known = sorted({f"{e.method} {e.path}" for e in self.exchanges})
            return f"nothing was recorded for {method} {path}; recorded: {', '.join(known)}"
        closest = max(recorded, key=lambda text: difflib.SequenceMatcher(None, text, received).ratio())
        lines = difflib.unified_diff(
            closest.splitlines(), received.splitlines(), "closest recorded request", "received request", lineterm=""
        )
        return "\n".join(lines)[:20_000]

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await read_request(reader)) is not None:
                served = self.answer(request.method, request.path, request.body_value())
                if served.exchange is None:
                    await write_response(writer, _unmatched_response(served))
                    break
                response = self.exchanges[served.exchange].response
                await write_response(writer, response)
                if not response.keeps_alive(request):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, WireError):
            pass
        finally:
            writer.close()


def _pretty(body) -> str:
    return json.dumps(body, indent=1, sort_keys=True, ensure_ascii=False)


def _unmatched_response(served: Served) -> Response:
    message = f"replay: no recorded exchange matches {served.method} {served.path}"
    body = json.dumps({"error": {"message": message, "type": "replay_unmatched", "diff": served.diff}}).encode()
    head = (
        f"HTTP/1.1 {UNMATCHED} Unmatched Request\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return Response(head, "length", [body.decode()])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fixture", type=Path)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    _, exchanges = load_fixture(args.fixture)
    server = ReplayServer(exchanges)
    url = server.start(args.port)
    print(f"REPLAY_URL={url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()
        for served in server.unmatched:
            print(f"unmatched {served.method} {served.path}:\n{served.diff}", file=sys.stderr)


if __name__ == "__main__":
    main()
