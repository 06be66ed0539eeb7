"""URL slugs."""

import re


def slugify(text: str) -> str:
    """Lower-case words joined by single dashes: "Hello, World!" -> "hello-world"."""
    words = re.findall(r"[A-Za-z0-9]+", text)
    return "-".join(words)
