"""The text of a variable while its producer generates it, for whoever streams it.

One writer (the task runner, as the engine's tokens arrive) appends deltas; any number of
readers follow at their own pace. A reader holds only its position: nothing is queued per
reader, so a slow reader gets several deltas joined in one read and a reader that goes
away costs nothing. The writer never waits on a reader. Waking the readers is one event,
replaced at each append that a reader waits for (the readers of the old one wake once).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class ValueStream:
    pieces: list[str] = field(default_factory=list)  # the deltas, in order
    tokens: list[int] = field(default_factory=list)  # tokens each delta took
    finish_reason: str | None = None  # the producer's, once it finished
    first_token_at: float | None = None  # unix seconds of the first delta of this run
    seen: bool = False  # a reader has read text of this run (a rerun would repeat it)
    readers: int = 0  # readers following now
    # A reader wants each delta as it is generated (a follower, a streamed answer). Else
    # the engine is asked for fewer, larger deltas (a late follower gets those).
    live: bool = False
    closed: bool = False  # its variable settled: no more deltas
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _waiting: int = 0  # readers waiting for a change now (none: an append wakes nobody)

    @property
    def text(self) -> str:
        """Everything generated so far."""
        return "".join(self.pieces)

    @property
    def position(self) -> int:
        """Where a reader that read everything is (a count of deltas)."""
        return len(self.pieces)

    @property
    def token_count(self) -> int:
        return sum(self.tokens)

    def append(self, delta: str, tokens: int = 1) -> None:
        if self.closed:
            return
        if self.first_token_at is None:
            self.first_token_at = time.time()
        if delta or tokens:
            self.pieces.append(delta)
            self.tokens.append(tokens)
            self._wake()

    def restart(self) -> None:
        """Its producer runs again from the start (nobody saw this run's text)."""
        self.pieces.clear()
        self.tokens.clear()
        self.first_token_at = None
        self._wake()

    def close(self, finish_reason: str | None = None) -> None:
        """Its variable settled: readers read what is left, then end."""
        if finish_reason is not None:
            self.finish_reason = finish_reason
        self.closed = True
        self._wake()

    def read(self, position: int) -> tuple[str, int, int]:
        """Text and tokens after ``position`` (a count of deltas), and the new position."""
        if position > len(self.pieces):  # it restarted under the reader: nothing was seen
            position = 0
        end = len(self.pieces)
        if end > position:
            self.seen = True
        return "".join(self.pieces[position:end]), sum(self.tokens[position:end]), end

    async def changed(self, timeout: float | None = None) -> None:
        """Wait for the next append (or restart, or close); returns at ``timeout`` anyway."""
        if self.closed:
            return
        self._waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        finally:
            self._waiting -= 1

    def _wake(self) -> None:
        if self._waiting:  # most values are generated with nobody following them
            self._changed.set()
            self._changed = asyncio.Event()
