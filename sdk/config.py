"""Where a client connects: arguments first, then ``PARROT_*`` environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_SERVER = "http://127.0.0.1:9000"
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ClientConfig:
    """``base_url``: argument, else ``$PARROT_SERVER``, else http://127.0.0.1:9000.
    ``admin_token`` (engine registry routes only): argument, else ``$PARROT_ADMIN_TOKEN``.
    ``timeout``: seconds for a response, plus the wait a get asks the server for."""

    base_url: str
    timeout: float
    admin_token: str | None

    @classmethod
    def resolve(cls, base_url: str | None, timeout: float, admin_token: str | None) -> ClientConfig:
        url = (base_url or os.environ.get("PARROT_SERVER") or DEFAULT_SERVER).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {url!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        return cls(url, float(timeout), admin_token or os.environ.get("PARROT_ADMIN_TOKEN"))
