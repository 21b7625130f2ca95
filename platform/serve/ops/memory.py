"""Giving memory back to the operating system after big transient work.

Tokenizing a 4 MiB prompt makes ~200 MB of short-lived objects (token ids, the tokenizer's
own encoding, the request to the engine). Freed, they stay with the process: glibc's
malloc keeps freed heap (per thread arena) for reuse, so the ServeCore grew by 500 MB after
one such request and never shrank (measured: 172 MB -> 578 MB; ``malloc_trim`` brought it
to 158 MB). After big work, the ServeCore asks malloc to return what is free, every few
seconds for a while (the work's objects die when its request ends, a moment the ServeCore
does not watch), in a worker thread. Where ``malloc_trim`` does not exist (not glibc), this
does nothing.

Big values are the other such work: a session holding 200 MiB of values, deleted, left the
process as big as before (measured: 226 MiB kept for good; one ``malloc_trim`` gave 200 MiB
back in 60 ms, on the worker thread). The
:class:`~parrot.platform.serve.limits.value_budget.ValueBudget` notes when a release is big, as the
tokenizers note a big text.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


class BigWork(Protocol):
    """What did big work lately: ``big_at``, its ``time.monotonic()`` (None: never)."""

    big_at: float | None


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


@dataclass
class MemoryTrimmer:
    every_s: float = 5.0  # at most one trim this often
    for_s: float = 60.0  # after the last big work
    trims: int = 0
    _last_trim: float = 0.0

    def __post_init__(self) -> None:
        self._trim = malloc_trim()

    async def after(self, big_work_at: float | None) -> bool:
        """Trim if big work happened in the last ``for_s`` seconds (``big_work_at``: its
        ``time.monotonic()``) and the last trim is ``every_s`` ago; True when it trimmed."""
        now = time.monotonic()
        if self._trim is None or big_work_at is None or now - big_work_at > self.for_s:
            return False
        if now - self._last_trim < self.every_s:
            return False
        self._last_trim = now
        await asyncio.to_thread(self._trim, 0)  # ctypes calls release the GIL
        self.trims += 1
        return True

    async def watch(self, sources: Sequence[BigWork], every_s: float = 1.0) -> None:
        """Trim after the big work of ``sources`` (the tokenizers' big texts, big values
        released), looking every ``every_s`` seconds (runs until cancelled)."""
        while True:
            await self.after(max((s.big_at for s in sources if s.big_at is not None), default=None))
            await asyncio.sleep(every_s)
