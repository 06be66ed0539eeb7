"""The vision toolset: ask a vision-capable model on the run's endpoint (--vision_model) about an image."""

from __future__ import annotations

import asyncio
import base64

from trajectory import split_reasoning
from trajforge.tools.netguard import Blocked, check_url
from trajforge.tools.session import ToolSession
from trajforge.tools.transfer import image_type, read_bytes

IMAGE_LIMIT = 20_000_000  # bytes of a workspace image sent inline


async def _data_url(session: ToolSession, path: str) -> str:
    data = await read_bytes(session.env, path, IMAGE_LIMIT)
    media_type = image_type(data)
    if media_type is None:
        raise ValueError(f"{path} is not a PNG, JPEG, GIF or WEBP image")
    encoded = await asyncio.to_thread(base64.b64encode, data)  # up to 20 MB: off the event loop
    return f"data:{media_type};base64,{encoded.decode()}"


async def vision_analyze(
    session: ToolSession, image_url: str, question: str = "Describe this image in detail."
) -> dict:
    """Ask a vision model about an image and return its answer.

    Args:
        image_url: an http(s) or data: URL, or the path of a PNG, JPEG, GIF or WEBP file in the workspace
        question: what to find out about the image
    """
    remote = image_url.startswith(("http://", "https://", "data:"))
    if image_url.startswith(("http://", "https://")):  # the vision model's server fetches it on our behalf
        settings = session.services.settings
        try:
            await check_url(image_url, settings.allow_private_urls, trusted=settings.trusted_origins)
        except Blocked as exc:
            return {"error": str(exc)}
    url = image_url if remote else await _data_url(session, image_url)
    content = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": url}}]
    message, usage = await session.services.model.chat([{"role": "user", "content": content}], session.caller)
    session.count_usage(usage)
    _, answer = split_reasoning(message)
    if not answer:
        return {"error": "the vision model gave no answer"}
    return {"image": image_url, "analysis": answer}
