"""The URL of a builtin engine, checked where it comes in (``POST /v1/engines``, ``--engine``).

``urlsplit`` accepts ``http://[::1`` and ports like 99999 until ``.port`` is read, and httpx
rejects other URLs (control characters) only when the first request is built; either
escaped from registration as a 500. Checked here, a bad URL is a 400 that says what is wrong.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from parrot.engines.protocol.errors import BadRequestError

EXAMPLE = "http://127.0.0.1:9001"


def check_engine_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host and a valid port; else BadRequestError.

    The messages never repeat the URL: it may carry credentials."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a port out of range or not a number)
    except ValueError as error:
        raise BadRequestError(f"engine url is not a valid URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise BadRequestError(f"engine url must be an http:// or https:// URL with a host, such as {EXAMPLE}")
    try:
        httpx.URL(url)
    except httpx.InvalidURL as error:
        raise BadRequestError(f"engine url is not a valid URL: {error}") from None
    return url
