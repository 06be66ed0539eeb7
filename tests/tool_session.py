"""Tools called directly, as the agent loop calls them: through call_tool, with a ToolSession on a
fresh local environment."""

from __future__ import annotations

import contextlib
import json

from trajforge.caller import NOBODY, Caller
from trajforge.environments import EnvironmentSettings, backend_for
from trajforge.model.settings import ModelSettings
from trajforge.tools import call_tool
from trajforge.tools.services import ToolServices
from trajforge.tools.session import ToolSession
from trajforge.tools.settings import ToolSettings
from trajforge.tools.toolsets import every_tool

NO_MODEL = "http://127.0.0.1:9/v1"  # for tests that make no model call


@contextlib.asynccontextmanager
async def tool_session(
    model_url: str = NO_MODEL, environment: EnvironmentSettings | None = None, caller: Caller = NOBODY, **settings
):
    """A session whose vision and image calls go to `model_url`, made for `caller`; `settings` override
    ToolSettings."""
    chosen = ToolSettings(**({"vision_model": "vision-test", "image_model": "image-test"} | settings))
    model = ModelSettings(model="test-model", base_url=model_url, api_key="test-key", max_retries=0)
    services = ToolServices(chosen, model)
    try:
        session = ToolSession(await backend_for(environment or EnvironmentSettings()).open({}), services, caller)
        try:
            yield session
        finally:
            await session.close()
    finally:
        await services.close()


async def call(session: ToolSession, name: str, **arguments) -> dict:
    return await call_tool(session, name, json.dumps(arguments), every_tool())
