"""The scripted server's hold and release, which the kill -9 tests rely on to know which calls a killed run
received: every chat request in flight at any moment of a hold waits for its release, and
release(answer=False) drops each of them unanswered, also one still in its latency when the hold ended.
A request that came after the release is answered."""

from __future__ import annotations

import threading

import httpx
import pytest
from conftest import wait_for

from trajforge.mock.server import CLIENT_GONE, MockServer

LATENCY = 1.0  # seconds before an answer: the hold and the release both fall within it


@pytest.fixture
def slow_server():
    server = MockServer(latency=LATENCY)
    server.base_url = server.start()
    yield server
    server.stop()


class Call(threading.Thread):
    """One chat request, sent from a thread: `answered` says whether its reply came back."""

    def __init__(self, server: MockServer, prompt: str):
        super().__init__(daemon=True)
        self.server, self.prompt = server, prompt
        self.answered: bool | None = None
        self.start()

    def run(self) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": self.prompt}]}
        try:
            reply = httpx.post(f"{self.server.base_url}/chat/completions", json=body, timeout=30)
            self.answered = reply.status_code == 200
        except httpx.RemoteProtocolError:  # the server closed the connection without an answer
            self.answered = False

    def arrived(self) -> None:
        wait_for(lambda: self.server.attempts[self.prompt] == 1, 10, f"{self.prompt!r} to reach the server")

    def status(self) -> int:
        self.join(30)
        (logged,) = [r["status"] for r in self.server.chat_requests() if r["prompt"] == self.prompt]
        return logged


@pytest.mark.parametrize("hold_first", [False, True], ids=["in-flight-when-held", "arrived-while-held"])
def test_a_request_in_flight_during_a_hold_is_dropped_even_when_released_before_its_answer(slow_server, hold_first):
    """A killed run's last request reaches the server during the hold, or is in flight when it begins; the test
    releases (answer=False) once the run is gone, which may be within that request's latency: it must die
    with the run, as one that was waiting at the hold does (before, it was answered, to nobody who paid)."""
    if hold_first:
        slow_server.hold()
    call = Call(slow_server, "killed")
    call.arrived()
    if not hold_first:
        slow_server.hold()
    slow_server.release(answer=False)
    assert call.status() == CLIENT_GONE and call.answered is False
    after = Call(slow_server, "a later run")  # the next run's requests are answered
    assert after.status() == 200 and after.answered


def test_a_request_held_and_released_with_answers_is_answered(slow_server):
    """The honest twin: release() lets a request in flight during the hold through, answered."""
    call = Call(slow_server, "held")
    call.arrived()
    slow_server.hold()
    slow_server.release()
    assert call.status() == 200 and call.answered
