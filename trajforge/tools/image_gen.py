"""The image_gen toolset: the OpenAI images API on the run's endpoint (--image_model); the image is
saved in the prompt's workspace."""

from __future__ import annotations

import base64
import hashlib
import re

from trajforge.tools.fetch import fetch
from trajforge.tools.services import ToolServices
from trajforge.tools.session import ToolSession
from trajforge.tools.transfer import image_type

IMAGE_LIMIT = 50_000_000  # bytes of a generated image downloaded from the provider's URL


def _slug(prompt: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:40].rstrip("-") or "image"


async def _download(services: ToolServices, url: str) -> bytes:
    image = await fetch(
        services.http,
        url,
        max_bytes=IMAGE_LIMIT,
        timeout=services.settings.fetch_timeout,
        accept=lambda media_type: media_type.startswith("image/") or media_type == "application/octet-stream",
    )
    if image.truncated:
        raise ValueError(f"the generated image at {url} is larger than {IMAGE_LIMIT} bytes")
    return image.body


async def image_generate(session: ToolSession, prompt: str, size: str = "1024x1024") -> dict:
    """Generate an image from a description. It is saved in the workspace under images/; its path
    comes back, and the provider's URL when it gives one.

    Args:
        prompt: what the image should show
        size: WIDTHxHEIGHT that the image model supports, e.g. 1024x1024, 1536x1024 or 1024x1536
    """
    if not re.fullmatch(r"\d{2,5}x\d{2,5}", size):
        return {"error": f"size must look like 1024x1024, got {size!r}"}
    services = session.services
    request = {"model": services.settings.image_model, "prompt": prompt, "size": size, "n": 1}
    response, usage = await services.model.generate_image(request, session.caller)
    session.count_usage(usage)  # gpt-image models report tokens (and OpenRouter a cost): the prompt's usage
    images = response.get("data") or []
    image = images[0] if images and isinstance(images[0], dict) else {}
    if not image.get("b64_json") and not image.get("url"):
        return {"error": "the image model returned no image"}
    data = base64.b64decode(image["b64_json"]) if image.get("b64_json") else await _download(services, image["url"])
    media_type = image_type(data)
    if media_type is None:
        return {"error": "the image model returned data that is not a PNG, JPEG, GIF or WEBP image"}
    # Named after its content, not at random: a re-run answered from the cache shows the model the same path.
    path = f"images/{_slug(prompt)}-{hashlib.sha256(data).hexdigest()[:6]}.{media_type.split('/')[1]}"
    await session.env.write_file(path, data)
    return {"path": path, "url": image.get("url"), "bytes": len(data), "revised_prompt": image.get("revised_prompt")}
