"""One TLS context for every HTTP client of a process (the model's, the tools'). Each new context reads
the CA bundle again (40-60 ms of CPU, five clients per worker); the runner makes it before it forks the
workers, which inherit it. The same context httpx makes by default: certifi's CA bundle, or the one
SSL_CERT_FILE / SSL_CERT_DIR name."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()
