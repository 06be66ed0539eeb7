"""The agent's chat calls: the request built from the run's settings (with --token_ids' extras), sent
by the model client through the money wrapper (money/metered.py), and its reply read as a Completion:
the assistant message, the usage with its cost, the retries, the finish reason, the token ids."""

from __future__ import annotations

from dataclasses import dataclass

from trajectory import Turn
from trajforge.caller import NOBODY, Caller
from trajforge.model.client import ModelClient
from trajforge.model.echo import exact_message, read_message
from trajforge.model.settings import ModelSettings
from trajforge.model.stream import answer, finish_reason, reported
from trajforge.model.tokens import REQUEST, TokensMissing, lacks_ids, turn_tokens
from trajforge.money.metered import Metered
from trajforge.money.reply_cost import reply_usage
from trajforge.money.spending import UNMETERED, Spends


@dataclass(frozen=True)
class Completion:
    """One model call's answer."""

    message: dict  # the assistant message
    usage: dict
    retries: int
    finish_reason: str = ""  # as the server said it: stop, tool_calls, length, content_filter; "" when none
    model: str = ""  # the model name the server reports in its reply; "" when none
    tokens: dict | None = None  # with --token_ids: {prompt_token_ids, token_ids, logprobs}, None where missing
    tokens_missing: str = ""  # with --token_ids: what the reply lacked, or ""


class ChatModel:
    """Chat calls through the response cache, the budget and the rate limits of `spending` (Unmetered:
    straight to the endpoint, as unit tests of the loop want)."""

    def __init__(self, settings: ModelSettings, spending: Spends = UNMETERED):
        self.settings = settings
        self.client = ModelClient(settings)
        self.metered = Metered(self.client, spending)

    async def close(self) -> None:
        await self.client.close()

    async def complete(
        self, messages: list[dict], tools: list[dict], caller: Caller = NOBODY, extra: dict | None = None
    ) -> Completion:
        """One model call for the `caller`'s sample (its usage with its cost), retried by our policy; `extra`:
        more of the request (a judge's response_format)."""
        settings = self.settings
        body = self.body(messages, tools) | (extra or {})
        # A 200 without an answer (`answer` raises BadReply) is retried, once paid for, and never cached.
        data, cost, retries = await self.metered(
            "/chat/completions", body, caller, self.client.post_chat, settings.prices, answer
        )
        tokens, missing = turn_tokens(data) if settings.token_ids != "off" else (None, "")
        if settings.token_ids == "required" and tokens is not None and lacks_ids(tokens):
            raise TokensMissing(f"{settings.base_url}: {missing}")
        usage = reply_usage(data) | {"cost": cost}
        return Completion(answer(data), usage, retries, finish_reason(data), reported(data), tokens, missing)

    def echo(self, message: dict, turn: Turn) -> dict:
        """The reply as it goes into the conversation for the next call: byte for byte with --token_ids,
        else as read (plain runs send what they always sent: the cache keys of older runs hold)."""
        return exact_message(message, turn) if self.settings.token_ids != "off" else read_message(message, turn)

    def body(self, messages: list[dict], tools: list[dict]) -> dict:
        """The request: what the response cache keys (with the endpoint and the sample) and sends."""
        body: dict[str, object] = {"model": self.settings.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if self.settings.max_tokens:
            body["max_tokens"] = self.settings.max_tokens
        return body | self.settings.extra_body | (REQUEST if self.settings.token_ids != "off" else {})
