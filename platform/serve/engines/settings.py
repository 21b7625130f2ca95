"""How the ServeCore talks to its engines: request timeouts and defaults (``parrot serve``
flags ``--engine-timeout``, ``--parent-wait``, ``--openai-capacity``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSettings:
    request_timeout_s: float = 600.0  # one request to an engine may take this long
    # A fork of a context whose own request is still on its way to the engine waits this long.
    parent_wait_s: float = 10.0
    openai_capacity: int = 16  # requests at once on an OpenAI endpoint registered without one

    def __post_init__(self) -> None:
        if min(self.request_timeout_s, self.parent_wait_s, self.openai_capacity) <= 0:
            raise ValueError("engine settings must be positive")
