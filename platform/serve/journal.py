"""Writes the ServeCore's state changes to the SQL store, in order, off the request path.

Every change (a session made, a variable's value, a call's state) is queued as one write;
one writer task applies them in the order they happened, so the store never sees a call
finish before it was submitted. A write that fails is tried again a few times; if it still
fails, its future carries a :class:`StoreError`. A route that answers a client waits for
its own writes first (:meth:`Journal.commit`) and fails with that error instead of
acknowledging what is not stored: a ServeCore killed right after a response loses nothing
it acknowledged, and a database that refuses writes is reported, never hidden.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from parrot.platform.serve.errors import StoreError
from parrot.platform.store.store import Store

log = logging.getLogger(__name__)

Write = Callable[[Store], Awaitable[Any]]
RETRY_DELAYS_S = (0.05, 0.25, 1.0)  # a locked or briefly unavailable database


class Journal:
    def __init__(self, store: Store | None) -> None:
        self.store = store
        self._queue: asyncio.Queue[tuple[Write, asyncio.Future]] = asyncio.Queue()
        self._writer: asyncio.Task | None = None
        self.failures = 0  # writes that failed for good (logged, and reported to their request)

    def start(self) -> None:
        if self.store is not None:
            self._writer = asyncio.create_task(self._write_loop(self.store))

    async def stop(self) -> None:
        if self._writer is not None:
            await self.flush()
            self._writer.cancel()
            self._writer = None

    def record(self, write: Write) -> asyncio.Future:
        """Queue one write (a function of the store); the future settles once it is applied.
        Without a store nothing is written and the future is already done."""
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        # A write nobody waits for (a background state change) must not leave an exception
        # unretrieved: its failure is logged and counted here.
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        if self.store is None:
            done.set_result(None)
        else:
            self._queue.put_nowait((write, done))
        return done

    async def commit(self, *writes: asyncio.Future) -> None:
        """Wait for these writes; raise :class:`StoreError` if one of them failed."""
        for done in writes:
            await asyncio.shield(done)

    async def flush(self) -> None:
        """Wait until every write queued so far is applied (failures are not raised here)."""
        if self._writer is not None:
            await self._queue.join()

    async def _write_loop(self, store: Store) -> None:
        while True:
            write, done = await self._queue.get()
            try:
                for attempt, delay in enumerate((*RETRY_DELAYS_S, None)):
                    try:
                        await write(store)
                        error = None
                        break
                    except Exception as failed:
                        error = failed
                        if delay is None:
                            self.failures += 1
                            log.error("could not write to the store (%d attempts): %s", attempt + 1, error)
                            break
                        log.warning("store write failed (%s); again in %.2f s", error, delay)
                        await asyncio.sleep(delay)
                if not done.done():
                    if error is None:
                        done.set_result(None)
                    else:
                        done.set_exception(StoreError(f"the database did not take the write: {error}"))
            finally:
                self._queue.task_done()
                # Not kept while waiting for the next one: a write's closure may hold a
                # whole session (its values: 200 MiB stayed after a delete).
                del write, done
