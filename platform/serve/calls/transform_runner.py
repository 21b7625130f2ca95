"""Native string transforms off the event loop, each within one time budget.

A transform is CPU work on client data (a regex over 256 inputs, JSON parsing): run on the
event loop it stalls every other request, ``/healthz`` included. Here it runs in a small
pool of worker threads of its own (so a burst of transforms cannot take the threads that
tokenization and the store use), within one budget for all its steps and values together
(:class:`TransformLimits`). Threads are enough: the ``regex`` module releases the GIL while
it searches (``concurrent=True``), and the pure-Python steps give the GIL back at every
switch interval (5 ms), so the loop keeps answering. The budget starts when a worker takes
the transform; a transform still queued when its session goes is dropped.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from parrot.platform.serve.calls import transforms


@dataclass(frozen=True)
class TransformLimits:
    budget_s: float = 2.0  # all steps over all values of one transform
    workers: int = 2  # transforms computed at once

    def __post_init__(self) -> None:
        if not self.budget_s > 0:
            raise ValueError("the transform budget must be positive")
        if self.workers < 1:
            raise ValueError("transform workers must be at least 1")


class TransformRunner:
    def __init__(self, limits: TransformLimits | None = None, max_chars: int = 8 * 2**20) -> None:
        self.limits = limits or TransformLimits()
        self.max_chars = max_chars  # the longest value a transform may make (a value's limit)
        self._pool: ThreadPoolExecutor | None = None  # made on first use, in the serving process

    async def apply(self, steps: list[transforms.Step], inputs: list[str]) -> str:
        """The transform's result (raises :class:`TransformError` with the reason)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="parrot-transform")
        loop = asyncio.get_running_loop()
        work = partial(transforms.apply, steps, inputs, self.limits.budget_s, self.max_chars)
        return await loop.run_in_executor(self._pool, work)

    def close(self) -> None:
        """Drop queued transforms; running ones end within their budget."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
