"""The browser tools and what serves them: Chromium in a sandbox behind a guard proxy, one service per run."""
