"""Configuration of an OpenAI engine: a frozen dataclass, validated with exceptions.

The API key is a secret: it is left out of ``repr()`` and of :meth:`OpenAIEngineConfig.describe`
(the public part, for listings). ``dataclasses.asdict`` would include it: do not use it to
show a config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from parrot.engines.protocol.errors import BadRequestError
from parrot.engines.protocol.urls import public_url as _public_url

CHAT, COMPLETIONS = "chat", "completions"
APIS: Final = (CHAT, COMPLETIONS)

# The openai client insists on a key; endpoints without authentication get this one.
PLACEHOLDER_KEY: Final = "none"


@dataclass(frozen=True)
class OpenAIEngineConfig:
    """One OpenAI-compatible endpoint and how to talk to it.

    - ``base_url``: the API root as the ``openai`` client takes it, e.g.
      ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``.
    - ``model``: the model name sent with every request (and reported by ``ping``).
    - ``api_key``: None (or empty) for endpoints without authentication.
    - ``api``: ``"chat"`` (``/chat/completions``, text mapped onto messages, see
      :mod:`parrot.engines.openai.chat_messages`) or ``"completions"`` (``/completions``, text verbatim).
    - ``capacity``: requests in flight to the endpoint at once (more wait in the engine).
      None: a llama.cpp server's parallel slots (its ``/props``), else ``default_capacity``.
    - ``plan_slots``: on a llama.cpp server, choose each request's slot by the prompts the
      slots hold (:mod:`parrot.engines.openai.slots`); off: the server chooses.
    - ``timeout_s``: the longest wait for the endpoint (connect, or between bytes of an answer).
    - ``max_retries``: retries by the ``openai`` client after a retryable failure (408, 409,
      429, 5xx, timeout, connection error; ``x-should-retry`` decides when sent), waiting
      ``Retry-After`` / ``retry-after-ms`` when sent, else exponentially from 0.5 s to 8 s.
    - ``cooldown_s``: after a hard failure the engine reports itself unavailable (``ping``
      raises) for this long, then probes the endpoint again.
    """

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    api: str = CHAT
    capacity: int | None = None
    default_capacity: int = 16
    plan_slots: bool = True
    timeout_s: float = 60.0
    max_retries: int = 4
    cooldown_s: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str):
            raise BadRequestError("base_url must be a string")
        url = self.base_url.strip()
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018  (raises ValueError on a bad port)
        except ValueError:
            raise BadRequestError(f"base_url is not a valid URL: {_public_url(url)!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
            raise BadRequestError(
                f"base_url must be an http:// or https:// URL with a host, got {_public_url(url)!r}"
            )
        object.__setattr__(self, "base_url", url.rstrip("/"))
        if not isinstance(self.model, str) or not self.model.strip():
            raise BadRequestError("an openai engine needs a non-empty 'model'")
        if self.api not in APIS:
            raise BadRequestError(f"api must be one of {list(APIS)}, got {self.api!r}")
        if self.api_key is not None and not isinstance(self.api_key, str):
            raise BadRequestError("api_key must be a string")
        if self.capacity is not None:
            _check_int("capacity", self.capacity, 1)
        _check_int("default_capacity", self.default_capacity, 1)
        _check_int("max_retries", self.max_retries, 0)
        _check_number("timeout_s", self.timeout_s, positive=True)
        _check_number("cooldown_s", self.cooldown_s)

    @property
    def key(self) -> str:
        """The key to send (the placeholder when there is none)."""
        return self.api_key or PLACEHOLDER_KEY

    @property
    def public_url(self) -> str:
        """``base_url`` without credentials or query (for messages and listings)."""
        return _public_url(self.base_url)

    def describe(self) -> dict:
        """The public part of the config (never the key)."""
        return {"base_url": self.public_url, "model": self.model, "api": self.api, "capacity": self.capacity}


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequestError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_number(name: str, value: object, positive: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise BadRequestError(
            f"{name} must be a {'positive' if positive else 'non-negative'} number, got {value!r}"
        )
