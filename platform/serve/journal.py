"""Writes the ServeCore's state changes to the SQL store, in order, off the request path.

Every change (a session made, a variable's value, a call's state) is queued as one write;
one writer task applies them in the order they happened, so the store never sees a
call finish before it was submitted. Routes that answer a client ``flush`` first, so what
a client was told exists is on disk before the response leaves: a ServeCore killed right
after a response loses nothing it acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from parrot.platform.store.store import Store

log = logging.getLogger(__name__)

Write = Callable[[Store], Awaitable[Any]]


class Journal:
    def __init__(self, store: Store | None) -> None:
        self.store = store
        self._queue: asyncio.Queue[Write] = asyncio.Queue()
        self._writer: asyncio.Task | None = None
        self.failures = 0  # writes that raised (logged; the ServeCore keeps serving)

    def start(self) -> None:
        if self.store is not None:
            self._writer = asyncio.create_task(self._write_loop(self.store))

    async def stop(self) -> None:
        if self._writer is not None:
            await self.flush()
            self._writer.cancel()
            self._writer = None

    def record(self, write: Write) -> None:
        """Queue one write (a function of the store). Without a store it is dropped."""
        if self.store is not None:
            self._queue.put_nowait(write)

    async def flush(self) -> None:
        """Wait until every write queued so far is applied."""
        if self._writer is not None:
            await self._queue.join()

    async def _write_loop(self, store: Store) -> None:
        while True:
            write = await self._queue.get()
            try:
                await write(store)
            except Exception:
                self.failures += 1
                log.exception("could not write to the store")
            finally:
                self._queue.task_done()
