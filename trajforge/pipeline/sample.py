"""One sample, start to end, in the order every kind of run keeps.

1. open the sample's environment (the run's backend);
2. put the task in place (files, workspace, setup: a failed setup costs no model call);
3. act: the agent, or for --check_tasks the oracle or nothing (actors.py);
4. redact what the actor brought back (a model may quote a secret), and release the sample's resources;
5. enter the clean room and verify (verification/checks.py), in the same environment, still open;
6. build the record, last, so that what verification spent (a judge's model calls, counted on the
   session) is in the sample's usage.

The worker (scheduling, claims, events, batch files) and --check_tasks both run their samples through
`SamplePipeline.run`, so the two cannot drift. What differs between them is an Actor and a Recorder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from trajforge.agent.loop import AgentResult
from trajforge.caller import Caller
from trajforge.environments import Backend
from trajforge.model.usage import add_usage
from trajforge.secrets import Secrets
from trajforge.tools.mcp.servers import Server
from trajforge.tools.mcp.toolsets import open_servers
from trajforge.tools.services import ToolServices
from trajforge.tools.session import ToolSession
from trajforge.verification.checks import verifies, verify_sample
from trajforge.verification.host_folders import HostFolders
from trajforge.verification.result import VerifySettings
from trajforge.verification.tasks import prepare_task

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Actor(Protocol):
    """What acts on the task between its setup and its verification."""

    async def __call__(self, session: ToolSession, entry: dict) -> AgentResult: ...


@dataclass(frozen=True)
class Acted:
    """What the record is built from: the actor's result (its usage: the model's, the tools' and the
    verification's), the verification, the secrets masked by kind, and the seconds until the actor ended."""

    result: AgentResult
    verification: dict
    redactions: dict[str, int]
    seconds: float


class Recorder(Protocol[R_co]):
    def view(self, result: AgentResult, seconds: float) -> dict:
        """The record so far, as a Python verifier (--verifier) is shown it."""
        ...

    def finish(self, acted: Acted) -> R_co:
        """The sample's record, once verified."""
        ...


@dataclass(frozen=True)
class Finished(Generic[R]):
    acted: Acted
    record: R


@dataclass(frozen=True)
class SamplePipeline:
    """The run's way of running one sample; shared by the samples of a process."""

    backend: Backend
    verify: VerifySettings
    task_folders: HostFolders  # where a task's `workspace` and `tests` folders may lie, and how they are read
    setup_timeout: float
    secrets: Secrets
    services: ToolServices | None = None  # None: the actor calls no tool (--check_tasks)
    servers: tuple[Server, ...] = ()  # MCP servers: each connected per sample, once its task is in place

    async def run(self, entry: dict, caller: Caller, act: Actor, recorder: Recorder[R]) -> Finished[R]:
        """The sample's record; the environment is closed whatever happens. Raises what fails the sample
        (SetupError, SetupFailed, a model call that failed): the caller decides what that costs."""
        started = time.monotonic()
        session = await self.open(entry, caller)
        try:
            result = await act(session, entry)
            seconds = time.monotonic() - started
            add_usage(result.usage, session.take_usage())  # the tools' own model calls (vision, images)
            # The model may quote the ephemeral prompt, a prefill message or a key a server echoed.
            self.secrets.redact_turns(result.turns, session.redactions)
            await session.release_all()  # the agent's resources (its browser context) end with the agent
            verification = await self.verified(session, entry, result, lambda: recorder.view(result, seconds))
            add_usage(result.usage, session.take_usage())  # what verification spent is the sample's too
            acted = Acted(result, verification, dict(session.redactions), seconds)
            return Finished(acted, recorder.finish(acted))
        finally:
            await session.close()

    async def open(self, entry: dict, caller: Caller) -> ToolSession:
        """The sample's environment, with the task's files and setup in place before any model call; the
        sample's model calls are made for `caller`."""
        session = ToolSession(await self.backend.open(entry, caller.scope), self.services, caller, self.secrets)
        try:
            verified = verifies(self.verify, entry)
            await session.env.verification_ahead(verified)  # its room kept before the task's setup could fill it
            await prepare_task(session.env, entry, self.task_folders, self.setup_timeout)
            # What changes from now on is the agent's (the clean room's git checks, for a sample verified).
            await session.env.agent_begins(verified)
            await open_servers(session, self.servers)  # resources of the session: released before the clean room
        except BaseException:
            await session.close()
            raise
        return session

    async def verified(self, session: ToolSession, entry: dict, result: AgentResult, view: Callable[[], dict]) -> dict:
        """The clean room, then the verification, in the sample's still open environment; its commands stay
        out of the conversation and tool_stats."""
        verification = await verify_sample(
            self.verify, entry, view, result.turns, session.env, self.task_folders, session
        )
        for name in ("output", "error"):  # a Python verifier's info and prints may quote a secret too
            verification[name] = session.redact(verification[name])
        return verification
