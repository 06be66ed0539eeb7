"""What a run tells the model client: the endpoint, the model and how to call it. Apart from the client
(model/client.py), whose `openai` import costs a second and a half, so that the flags are read without it."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from trajforge.flags import default
from trajforge.flags.values import TokenMode
from trajforge.money.pricing import Prices

NO_KEY = "not-needed"  # what we send to a local server when the user gave no key: no secret


@dataclass(frozen=True)
class ModelSettings:
    model: str
    base_url: str
    api_key: str = field(repr=False)
    max_tokens: int | None = None
    extra_body: dict = field(default_factory=dict)  # OpenRouter `provider` and `reasoning` options
    request_timeout: float = default("request_timeout")  # a whole request: connecting to the last byte
    max_retries: int = default("max_retries")
    stream: bool = False
    prices: Prices | None = None  # --price_input/--price_output/--price_cached_input, for this model's calls
    token_ids: TokenMode = "off"  # --token_ids: off, on or required (model/tokens.py)
    cache_as: str = ""  # the endpoint as the response cache names it, when not base_url (the mock's changing port)

    @property
    def openrouter(self) -> bool:
        return urlsplit(self.base_url).hostname == "openrouter.ai"
