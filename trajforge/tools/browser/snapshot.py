"""A page as text for the model: Playwright's aria snapshot in "ai" mode, the accessibility tree as
indented lines (``- button "Greet me" [ref=e6]``) with a ref on every element, which browser_click and
browser_type accept. Playwright's own MCP server for agents reads pages the same way.

Playwright keeps the elements of the latest snapshot of each page and resolves a ref with its
``aria-ref=`` selector, so a ref names the element itself (no fragile selector) until the page changes.
Refs of a later document carry a frame prefix (``f1e5``).
"""

from __future__ import annotations

import re

SNAPSHOT_LIMIT = 20_000  # characters
REF = re.compile(r"(?:f\d+)?e\d+")


async def snapshot(page) -> str:
    """The page as text, cut at SNAPSHOT_LIMIT characters with a marker."""
    text = await page.aria_snapshot(mode="ai")  # waits out a navigation under way, then reads the new page
    if len(text) > SNAPSHOT_LIMIT:
        cut = len(text) - SNAPSHOT_LIMIT
        text = text[:SNAPSHOT_LIMIT] + f"\n[... {cut} more characters of the page cut ...]"
    return text


async def element(page, ref: str):
    """The element a snapshot named `ref`; ValueError/LookupError tell the model how to get a good ref."""
    if not REF.fullmatch(ref):
        raise ValueError(f"{ref!r} is not a ref; refs look like e12 and come from browser_snapshot")
    found = page.locator(f"aria-ref={ref}")
    if not await found.count():
        raise LookupError(f"no element {ref} on the page now; call browser_snapshot for fresh refs")
    return found
