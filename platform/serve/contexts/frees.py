"""Frees that nothing waits for, batched: one engine request for the contexts of many.

A one-shot call (``client.call``: a session opened and closed with its answer) leaves its
contexts on the engine once the answer is out. Freeing them at once cost an engine
``abort`` request per call, a tenth of the ServeCore's CPU per call in a py-spy profile
(issue 35). Nothing computes on them any more and no one can fork from them (they left
their tree first), so their frees wait up to ``delay_s`` for others to the same engine and
go in one request: at most ``batch`` contexts, or ``delay_s`` later.

The KV they hold stays held that much longer: at most ``batch`` contexts per engine, for
at most ``delay_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence

from parrot.platform.serve.contexts.tree import free_on_engine

DELAY_S = 0.1  # ~2 single calls on the CPU's bundled model; dozens under concurrent load
BATCH = 64


class BatchedFrees:
    """Context ids to free per engine (keyed by its client), sent in batches; each batch's
    request runs as ``background`` work (the context manager's, awaited at its stop)."""

    def __init__(
        self, background: Callable[[Coroutine], None], delay_s: float = DELAY_S, batch: int = BATCH
    ) -> None:
        self.background = background
        self.delay_s = delay_s
        self.batch = batch
        self.requests = 0  # engine requests sent (for tests and benchmarks)
        self._pending: dict[object, list[int]] = {}
        self._timers: dict[object, asyncio.TimerHandle] = {}

    def add(self, client, context_ids: Sequence[int]) -> None:
        """Free ``context_ids`` on ``client``'s engine with the next batch (must run on the
        event loop)."""
        if not context_ids:
            return
        pending = self._pending.setdefault(client, [])
        pending.extend(context_ids)
        if len(pending) >= self.batch:
            self._send(client)
        elif client not in self._timers:
            self._timers[client] = asyncio.get_running_loop().call_later(self.delay_s, self._send, client)

    def pending(self) -> int:
        """Contexts waiting for their batch."""
        return sum(map(len, self._pending.values()))

    def flush(self) -> None:
        """Send every batch now (at stop)."""
        for client in list(self._pending):
            self._send(client)

    def _send(self, client) -> None:
        if (timer := self._timers.pop(client, None)) is not None:
            timer.cancel()
        ids = self._pending.pop(client, [])
        if ids:
            self.requests += 1
            self.background(free_on_engine(client, ids))
