"""A session: a client's variables and calls, until it is deleted or expires."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.variables.variable import SemanticVariable


@dataclass(eq=False)
class Session:
    session_id: str
    auth_hash: str
    vars: dict[str, SemanticVariable] = field(default_factory=dict)
    calls: dict[str, RequestChain] = field(default_factory=dict)
    last_active: float = field(default_factory=time.monotonic)
    stored: bool = True  # persisted; one-shot sessions of the OpenAI front are not
    stored_active: float = field(default_factory=time.monotonic)  # last_active as stored
    closed: bool = False  # deleted or expired: its work is stopped
    label: str | None = None  # what its client named it, to find it by (stored with it)
    tags: tuple[str, ...] = ()
    # The write of its record while nobody waited for it yet (a batch that opens its
    # session waits for it with its calls': one commit for both).
    unconfirmed: asyncio.Future | None = None
