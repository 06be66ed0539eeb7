"""What the tools need to know about the run, built once from the flags and the environment variables."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from trajforge.tools.search_providers import SearchProvider, search_provider

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@dataclass(frozen=True)
class ToolSettings:
    vision_model: str  # the model vision_analyze asks, on the run's endpoint
    image_model: str  # the model image_generate asks through the images API
    search: SearchProvider | None = None  # None: web_search is not offered
    browser_executable: str | None = None  # None: the browser toolset is not offered
    browser_endpoint: str | None = None  # the run's browser service (a Unix socket), else each worker launches its own
    fetch_timeout: float = 20.0  # seconds for one whole page or search request, redirects included
    fetch_max_bytes: int = 2_000_000  # decoded bytes of a page or search answer read; extracting more gets slow
    allow_private_urls: bool = False  # URLs a model chooses may reach loopback, private, link-local... addresses
    trusted_origins: frozenset[str] = frozenset()  # host:port reachable all the same: the mock model's server

    @classmethod
    def from_environment(
        cls, vision_model: str, image_model: str, allow_private_urls: bool, environ: Mapping[str, str] = os.environ
    ) -> ToolSettings:
        return cls(
            vision_model=vision_model,
            image_model=image_model,
            allow_private_urls=allow_private_urls,
            search=search_provider(environ),
            browser_executable=find_browser(environ),
        )


def find_browser(environ: Mapping[str, str]) -> str | None:
    """BROWSER_EXECUTABLE if set, else the first Chromium on PATH (Debian's package installs /usr/bin/chromium)."""
    if environ.get("BROWSER_EXECUTABLE"):
        return environ["BROWSER_EXECUTABLE"]
    return next((path for name in BROWSER_NAMES if (path := shutil.which(name))), None)
