"""Images in a prompt's environment: recognising their type, and reading their bytes. An environment
writes bytes but reads text, so a file's bytes travel base64 encoded through a temporary file in the
working directory, encoded inside the environment by `base64` (coreutils or busybox, so a container
has it too)."""

from __future__ import annotations

import asyncio
import base64
import secrets
import shlex

from trajforge.environments import Environment

_MAGIC = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}


def image_type(data: bytes) -> str | None:
    """The media type of PNG, JPEG, GIF and WEBP data, from its first bytes; None for anything else."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((media_type for magic, media_type in _MAGIC.items() if data.startswith(magic)), None)


async def read_bytes(env: Environment, path: str, limit: int) -> bytes:
    quoted = shlex.quote(path)
    # Only a regular file: `wc` on /dev/zero or a FIFO would hold the call until its time limit.
    size = await env.exec(f"[ -f {quoted} ] || {{ echo not a regular file; exit 1; }}; wc -c < {quoted}")
    if size.exit_code != 0:
        raise FileNotFoundError(f"cannot read {path}: {size.output.strip()}")
    if int(size.output.split()[0]) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    temporary = f".transfer-{secrets.token_hex(6)}.b64"
    try:
        encoded = await env.exec(f"base64 < {quoted} > {temporary}")
        if encoded.exit_code != 0:
            raise OSError(f"cannot encode {path}: {encoded.output.strip()}")
        encoded_text = await env.read_file(temporary)
        return await asyncio.to_thread(base64.b64decode, encoded_text)  # up to tens of MB: off the event loop
    finally:
        await env.exec(f"rm -f {temporary}")
