"""What an endpoint does wrong, said as what it is: a context overflow fails its prompt at once with the
way out; a connection that is refused, reset, not resolved, not TLS or silent has its own error type
and its real cause; a run whose endpoint does not answer at all stops before its pool starts (exit 2).

The classification in-process (trajforge.model.retry), the runs through batch_runner's entry point
against the scripted server and small raw TCP servers on 127.0.0.1; the DNS failure in a subprocess in
a private network namespace, so that no query leaves the machine."""

from __future__ import annotations

import shutil
import socket
import ssl
import struct
import subprocess
import threading

import aiohttp
import httpx
import openai
import pytest

from trajforge.mock.server_errors import OVERFLOWS
from trajforge.model.outcomes import ReplyTimeout
from trajforge.model.retry import CONTEXT_HINT, BadReply, Decision, classify, connection_kind, failure_message

TOOLS = ["--distribution=terminal_only", "--max_retries=2"]
REQUEST = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")

# -- context overflows, in-process -------------------------------------------------------------------


def status_error(status: int, body) -> openai.APIStatusError:
    """The exception the openai client raises for this answer."""
    response = httpx.Response(status, json=body, request=REQUEST)
    return openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")._make_status_error_from_response(response)


OVERFLOW_FORMS = {
    **{name: (status, body) for name, (status, body) in OVERFLOWS.items()},  # llama.cpp, OpenAI, vLLM
    "llamacpp_new": (
        400,
        {
            "error": {
                "code": 400,
                "message": "request (9000 tokens) exceeds the available context size (4096 tokens), try increasing it",
                "type": "exceed_context_size_error",
            }
        },
    ),
    "openrouter": (
        400,
        {"error": {"message": "This endpoint's maximum context length is 131072 tokens.", "code": 400}},
    ),
    "anthropic": (400, {"error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 > 200000"}}),
    "window": (400, {"error": {"message": "Your input exceeds the context window of this model."}}),
    "google": (400, {"error": {"message": "The input token count (1200000) exceeds the maximum number of tokens"}}),
    "413": (413, {"error": {"message": "context_length_exceeded"}}),
}


@pytest.mark.parametrize("form", OVERFLOW_FORMS)
def test_classify_fails_a_context_overflow_at_once_in_every_form(form):
    status, body = OVERFLOW_FORMS[form]
    assert classify(status_error(status, body)) == Decision(False, False, "context_length")


def test_an_overflow_inside_a_200_or_a_stream_error_event_is_one_too():
    upstream = BadReply('reply without an answer: {"message": "maximum context length is 8192 tokens"}')
    assert classify(upstream).kind == "context_length"
    event = openai.APIError(
        "Context size has been exceeded.", REQUEST, body={"message": "Context size has been exceeded."}
    )
    assert classify(event) == Decision(False, False, "context_length")


@pytest.mark.parametrize(
    ("status", "decision"),
    [
        (429, Decision(True, False, "http_429")),  # rate limits speak of tokens too: waiting helps
        (401, Decision(False, True, "http_401")),
        (500, Decision(True, False, "http_500")),
    ],
)
def test_what_is_not_an_overflow_stays_as_it_was(status, decision):
    tokens = {"error": {"message": "Rate limit reached for tokens per min; context length is fine"}}
    plain = {"error": {"message": "internal error"}}
    assert classify(status_error(status, tokens if status == 429 else plain)) == decision


def test_the_message_of_an_overflow_keeps_the_servers_words_and_says_what_to_change():
    status, body = OVERFLOWS["llamacpp"]
    message = failure_message(status_error(status, body), "context_length")
    assert "Context size has been exceeded." in message and CONTEXT_HINT in message
    for way_out in ("--max_turns", "--max_tokens", "--distribution", "--num_workers x --concurrency", "--parallel"):
        assert way_out in message


# -- connection errors, in-process --------------------------------------------------------------------


def wrapped(cause: BaseException, *outer: BaseException) -> BaseException:
    """`cause` wrapped by `outer` (innermost first), as aiohttp, httpx and openai wrap a socket error."""
    inner = cause
    for exc in outer:
        exc.__cause__ = inner
        inner = exc
    return inner


def client_error(cause: BaseException) -> openai.APIConnectionError:
    """What openai raises over aiohttp: httpx-aiohttp calls every connect failure a ConnectTimeout."""
    return wrapped(cause, httpx.ConnectTimeout(str(cause)), openai.APITimeoutError(REQUEST))


CONNECTION_CASES = {
    "connection_refused": ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)"),
    "connection_reset": ConnectionResetError(104, "Connection reset by peer"),
    "dns_failure": socket.gaierror(-3, "Temporary failure in name resolution"),
    "tls_failure": ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"),
    "timeout": aiohttp.SocketTimeoutError("Timeout on reading data from socket"),
}


@pytest.mark.parametrize("kind", CONNECTION_CASES)
def test_a_connection_error_is_named_by_its_real_cause(kind):
    exc = client_error(CONNECTION_CASES[kind])
    assert connection_kind(exc) == kind
    assert classify(exc) == Decision(kind != "tls_failure", False, kind)  # a TLS setting does not heal by waiting
    message = failure_message(exc, kind)
    assert str(CONNECTION_CASES[kind]) in message and "Request timed out" not in message


def test_a_connection_error_without_a_known_cause_stays_a_connection_error():
    assert classify(openai.APIConnectionError(request=REQUEST)) == Decision(True, False, "connection")
    assert classify(openai.APITimeoutError(REQUEST)).kind == "timeout"
    assert failure_message(ReplyTimeout("no whole reply within 1s (--request_timeout)"), "timeout") == (
        "no whole reply within 1s (--request_timeout)"
    )


def test_a_looping_chain_of_causes_ends():
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert connection_kind(wrapped(first, openai.APIConnectionError(request=REQUEST))) == "connection"


# -- raw servers on 127.0.0.1 ------------------------------------------------------------------------------


class RawServer:
    """A TCP server on 127.0.0.1 that misbehaves: `reset` resets every connection, `silent` accepts and
    never answers, `no_models` answers 404 to everything, `reset_chat` answers GET /models and resets
    every other request."""

    def __init__(self, mode: str):
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.heard: list[str] = []  # request lines
        self.open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return conn.close()
            data += chunk
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        self.heard.append(line)
        if self.mode == "silent":
            self.open.append(conn)  # held open, never answered
            return
        if self.mode == "no_models" or (self.mode == "reset_chat" and line.startswith("GET ")):
            body = b'{"error": "not found"}' if self.mode == "no_models" else b'{"data": []}'
            status = b"404 Not Found" if self.mode == "no_models" else b"200 OK"
            conn.sendall(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n" % len(body) + body
            )
            return conn.close()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
        conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.open:
            conn.close()


@pytest.fixture
def raw():
    made: list[RawServer] = []

    def make(mode: str) -> RawServer:
        made.append(RawServer(mode))
        return made[-1]

    yield make
    for server in made:
        server.close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def unreachable(result, url: str, cause: str) -> None:
    """Exit 2 before the pool: the URL and the cause said, no batch file, no error line, no checkpoint."""
    assert result.code == 2, result.stdout + result.stderr
    assert f"--base_url {url} cannot be reached: {cause}" in result.stderr
    assert "No prompt was sent" in result.stderr
    assert not list(result.run_dir.glob("batch_*.jsonl"))
    assert not (result.run_dir / "errors.jsonl").exists() and not (result.run_dir / "checkpoint.json").exists()


# -- the pre-check ------------------------------------------------------------------------------------------


def test_a_refused_connection_stops_the_run_before_its_pool_with_the_cause(run_here):
    url = closed_port_url()
    result = run_here([{"prompt": "x"}], *TOOLS, f"--base_url={url}")
    unreachable(result, url, "connection refused (is the server running on that port?): ")
    assert "Connect call failed" in result.stderr and "timed out" not in result.stderr.lower()


def test_a_server_that_resets_every_connection_is_unreachable(run_here, raw):
    server = raw("reset")
    result = run_here([{"prompt": "x"}], *TOOLS, f"--base_url={server.url}")
    unreachable(result, server.url, "connection reset by the server: ")
    assert set(server.heard) == {"GET /v1/models HTTP/1.1"}  # the check (the client tries a reset GET twice)


def test_https_to_a_plain_http_server_is_a_tls_failure(run_here, server):
    url = server.base_url.replace("http://", "https://")
    result = run_here([{"prompt": "x"}], *TOOLS, f"--base_url={url}")
    unreachable(result, url, "TLS failure (is the URL https:// for an http:// server?): ")
    assert "WRONG_VERSION_NUMBER" in result.stderr and server.chat_requests() == []


def test_a_server_that_never_answers_is_a_timeout(run_here, raw):
    server = raw("silent")
    result = run_here([{"prompt": "x"}], *TOOLS, f"--base_url={server.url}", "--request_timeout=0.5")
    unreachable(result, server.url, "timed out: ")
    assert server.heard == ["GET /v1/models HTTP/1.1"]


def test_any_http_answer_counts_as_answering_a_404_too(run_here, raw):
    server = raw("no_models")
    result = run_here([{"prompt": "x"}], *TOOLS, f"--base_url={server.url}")
    assert result.code == 4  # the run went ahead; its prompt failed on the server's 404, for good
    assert [e["error_type"] for e in result.jsonl("errors.jsonl")] == ["api_http_404"]
    assert server.heard == ["GET /v1/models HTTP/1.1", "POST /v1/chat/completions HTTP/1.1"]


def test_a_resume_with_nothing_left_to_run_never_contacts_the_endpoint(run_here, server):
    entries = [{"prompt": "one"}, {"prompt": "two"}]
    assert run_here(entries, *TOOLS).code == 0
    server.stop()  # the run's endpoint (which run.json remembers) is gone: a re-merge must not need it
    again = run_here(entries, *TOOLS, "--resume", "--require_reasoning=False")
    assert again.code == 0, again.stdout + again.stderr
    assert "0 to run" in again.stdout and len(again.trajectories) == 2


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is not installed")
def test_a_name_that_does_not_resolve_is_a_dns_failure(run, tmp_path):
    # In a network namespace of its own, with only a loopback, no DNS query can leave the machine.
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"no private network namespace can be made here: {probe.stderr.strip()}")
    url = "http://batch-runner-test.invalid/v1"
    command = run.command([{"prompt": "x"}], *TOOLS, "--environment=local", f"--base_url={url}")
    script = "ip link set lo up 2>/dev/null; exec " + " ".join(f"'{part}'" for part in command)
    proc = subprocess.run(["unshare", "-rn", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--base_url {url} cannot be reached: the host name could not be resolved: " in proc.stderr


# -- errors during the run ------------------------------------------------------------------------------


def test_a_connection_broken_during_the_run_fails_with_its_own_type(run_here, raw):
    server = raw("reset_chat")
    result = run_here([{"prompt": "x"}], *TOOLS, f"--base_url={server.url}", "--max_retries=1")
    assert result.code == 1
    (error,) = result.jsonl("errors.jsonl")
    assert (error["error_type"], error["attempts"]) == ("api_connection_reset", 2)
    assert error["message"].startswith("connection reset by the server: ")
    # The first message of the type is printed as it happens, with the retry; the summary counts it.
    assert "api_connection_reset: prompt 0, retrying: connection reset by the server" in result.stderr
    assert "1 failed, 0 discarded, 1 retries" in result.stdout


@pytest.mark.parametrize(("form", "stream"), [("llamacpp", False), ("openai", True), ("vllm", False)])
def test_a_context_overflow_fails_the_prompt_at_once_and_says_what_to_change(run_here, server, form, stream):
    entries = [{"prompt": f"too long [mock overflow={form}]"}, {"prompt": "fits"}]
    result = run_here(entries, *TOOLS, *(["--stream"] if stream else []), "--num_workers=1")
    assert result.code == 4  # an overflow is the endpoint's answer for good: a resume does not send it
    (error,) = result.jsonl("errors.jsonl")
    assert (error["error_type"], error["attempts"]) == ("context_length", 1)
    assert "--max_turns" in error["message"] and "--max_tokens" in error["message"]
    assert len([r for r in server.chat_requests() if "too long" in r["prompt"]]) == 1  # never retried
    assert "context_length: prompt 0 failed: " in result.stderr
    assert result.statistics["errors"] == {"context_length": 1} and len(result.trajectories) == 1
