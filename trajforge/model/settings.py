"""What a run tells the model client: the endpoint, the model and how to call it. Apart from the client
(model/client.py), whose `openai` import costs a second and a half, so that the flags are read without it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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


@dataclass(frozen=True)
class JudgeEndpoint:
    """Where a judge (verification/judge.py) is asked: --judge_model, --judge_base_url, --judge_api_key and
    the judge's prices; what is not given follows the run's model and endpoint."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)  # for base_url; the run's key goes with the run's endpoint
    prices: Prices | None = None

    def settings(self, run: ModelSettings) -> ModelSettings:
        """The judge's own settings: never streamed, no token ids, none of the run's request options (they are
        the agent model's), the run's prices only for the run's own model at the run's endpoint."""
        model = self.model or run.model
        same = self.base_url is None
        prices = self.prices or (run.prices if same and model == run.model else None)
        return replace(
            run,
            model=model,
            base_url=run.base_url if same else self.base_url or "",
            api_key=run.api_key if same else self.api_key or NO_KEY,
            cache_as=run.cache_as if same else "",
            max_tokens=None,
            extra_body={},
            stream=False,
            prices=prices,
            token_ids="off",
        )
