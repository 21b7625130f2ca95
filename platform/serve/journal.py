"""Writes the ServeCore's state changes to the SQL store, in order, off the request path.

Every change (a session made, a variable's value, a call's state) is queued as one write;
one writer task applies them in the order they happened, so the store never sees a call
finish before it was submitted. What was queued while a transaction ran goes in the next
one together (group commit: one commit for a DAG's calls and their state changes). A
write that fails is tried again a few times; if it still fails, its future carries a
:class:`StoreError`. A route that answers a client waits for its own writes first
(:meth:`Journal.commit`) and fails with that error instead of acknowledging what is not
stored: a ServeCore killed right after a response loses nothing it acknowledged, and a
database that refuses writes is reported, never hidden.
"""

from __future__ import annotations

import asyncio
import logging

from parrot.platform.serve.errors import StoreError
from parrot.platform.store.store import Store, Write

log = logging.getLogger(__name__)

RETRY_DELAYS_S = (0.05, 0.25, 1.0)  # a locked or briefly unavailable database
MAX_BATCH = 256  # writes in one transaction at most


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
        """Queue one write (a function of the store's statements, run in its transaction:
        :class:`~parrot.platform.store.writes.StoreWrites`); the future settles once it is applied.
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
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                if len(batch) > 1 and await self._write_together(store, batch):
                    continue
                for write, done in batch:  # alone, each with its retries
                    for attempt, delay in enumerate((*RETRY_DELAYS_S, None)):
                        try:
                            await store.write(write)
                            error = None
                            break
                        except Exception as failed:
                            error = failed
                            if delay is None:
                                self.failures += 1
                                log.error("the store refused a write (%d attempts): %s", attempt + 1, error)
                                break
                            log.warning("store write failed (%s); again in %.2f s", error, delay)
                            await asyncio.sleep(delay)
                    if not done.done():
                        if error is None:
                            done.set_result(None)
                        else:
                            done.set_exception(StoreError(f"the database did not take the write: {error}"))
            finally:
                for _ in batch:
                    self._queue.task_done()
                # Not kept while waiting for the next ones: a write's closure may hold a
                # whole session (its values: 200 MiB stayed after a delete).
                batch = write = done = None

    async def _write_together(self, store: Store, batch: list[tuple[Write, asyncio.Future]]) -> bool:
        """The writes queued meanwhile, in order, in one transaction (group commit). False
        if it failed: nothing of it is stored, and each write is then tried on its own, so
        one bad write fails alone."""
        try:
            await store.write(*(write for write, _ in batch))
        except Exception as error:
            log.debug("a batch of %d writes failed (%s); writing them one by one", len(batch), error)
            return False
        for _, done in batch:
            if not done.done():
                done.set_result(None)
        return True
