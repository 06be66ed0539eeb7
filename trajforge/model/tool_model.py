"""What tools may ask of the run's endpoint (vision_analyze, image_generate), and nothing more.

Their requests go to the run's endpoint with its key, under the run's retry policy, never streamed:
a tool sees a chat reply or an images answer, never the client behind them."""

from __future__ import annotations

from dataclasses import replace

from trajforge.model.client import ModelClient, ModelSettings


class ToolModel:
    def __init__(self, settings: ModelSettings, chat_model: str):
        self._client = ModelClient(replace(settings, model=chat_model, stream=False))

    async def chat(self, messages: list[dict]) -> tuple[dict, dict]:
        """(assistant message, usage) of the chat model's reply to `messages`, offered no tools."""
        completion = await self._client.complete(messages, [])
        return completion.message, completion.usage

    async def generate_image(self, request: dict) -> dict:
        """The images API's answer to `request` (its model, prompt, size ...), as JSON."""
        answer, _ = await self._client.call(lambda: self._client.post_json("/images/generations", request))
        return answer

    async def close(self) -> None:
        await self._client.close()
