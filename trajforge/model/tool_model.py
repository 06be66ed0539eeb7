"""What tools may ask of the run's endpoint (vision_analyze, image_generate), and nothing more.

Their requests go to the run's endpoint with its key, under the run's retry policy, never streamed,
through the same money wrapper (money/metered.py: response cache, budget and rate limits) as the
agent's own calls: a tool sees a chat reply or an images answer, never the client behind them."""

from __future__ import annotations

from dataclasses import replace

from trajforge.caller import NOBODY, Caller
from trajforge.model.chat import ChatModel
from trajforge.model.settings import ModelSettings
from trajforge.money.pricing import priced
from trajforge.money.reply_cost import reply_usage
from trajforge.money.spending import UNMETERED, Spends


class ToolModel:
    def __init__(self, settings: ModelSettings, chat_model: str, spending: Spends = UNMETERED):
        # A tool's model calls are not the agent's turns: no token ids (--token_ids) for them.
        # The prices are those of --model: a different --vision_model is priced only by what the endpoint reports.
        prices = settings.prices if chat_model == settings.model else None
        own = replace(settings, model=chat_model, stream=False, prices=prices, token_ids="off")
        self._chat = ChatModel(own, spending)

    async def chat(self, messages: list[dict], caller: Caller = NOBODY) -> tuple[dict, dict]:
        """(assistant message, usage with its cost) of the chat model's reply to `messages`, offered no
        tools, for the `caller`'s sample."""
        completion = await self._chat.complete(messages, [], caller)
        return completion.message, completion.usage

    async def generate_image(self, request: dict, caller: Caller = NOBODY) -> tuple[dict, dict]:
        """(the images API's answer to `request` (its model, prompt, size ...) as JSON, its usage with
        its cost: what the endpoint reports, else unknown)."""
        client = self._chat.client

        async def send(body: dict) -> dict:
            return await client.post_json("/images/generations", body)

        answer, cost, _ = await self._chat.metered("/images/generations", request, caller, send, None)
        return answer, priced(reply_usage(answer), None) | {"cost": cost}

    async def close(self) -> None:
        await self._chat.close()
