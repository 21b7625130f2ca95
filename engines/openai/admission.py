"""Requests at once to an endpoint, and the llama.cpp slot each runs in.

At most ``capacity`` requests are in flight (more wait here, not at the endpoint). On a
llama.cpp server whose slots the engine plans (:mod:`parrot.engines.openai.slots`), its slots
are the bound, unless a capacity was configured; each request runs in the slot chosen for
its prompt, and the answer's ``timings`` teach the planner the server's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from parrot.engines.openai.slots import Slot, SlotPlanner


class Admission:
    def __init__(self, capacity: int) -> None:
        self.planner: SlotPlanner | None = None  # a llama.cpp server's slots
        self._limit: asyncio.Semaphore | None = asyncio.Semaphore(capacity)
        self.running = self.waiting = 0

    @property
    def waited_for_prefix(self) -> int:
        return self.planner.waited if self.planner is not None else 0

    def configure(self, capacity: int, slots: int | None, bounded: bool) -> None:
        """``capacity`` requests at once; plan ``slots`` llama.cpp slots (None: the server
        chooses), which bound the requests at once unless ``bounded`` (a configured capacity).
        Kept as they are while requests run (they hold the current limits)."""
        if self.running or self.waiting:
            return
        if slots is None:
            self.planner = None
        elif self.planner is None or len(self.planner.slots) != slots:
            self.planner = SlotPlanner(slots)
        self._limit = asyncio.Semaphore(capacity) if bounded or self.planner is None else None

    def kept_prefix(self, prompt: str) -> int | None:
        """Characters of ``prompt`` a request could use in the planned slots now (None: none)."""
        return self.planner.kept_prefix(prompt) if self.planner is not None else None

    def worth_queueing(self, prompt: str, elsewhere_shared: int, elsewhere_busy: int) -> bool:
        """See :meth:`SlotPlanner.worth_queueing` (False: the slots are not planned here)."""
        planner = self.planner
        return planner is not None and planner.worth_queueing(prompt, elsewhere_shared, elsewhere_busy)

    @contextlib.asynccontextmanager
    async def request(self, prompt: str, max_tokens: int) -> AsyncIterator[Slot | None]:
        """One of ``capacity`` requests in flight; on a planned llama.cpp server, in the
        slot chosen for ``prompt`` (None: the server chooses)."""
        async with contextlib.AsyncExitStack() as held:
            self.waiting += 1
            try:
                if self._limit is not None:
                    await held.enter_async_context(self._limit)
                planner = self.planner
                slot = await held.enter_async_context(planner.slot(prompt, max_tokens)) if planner else None
            finally:
                self.waiting -= 1
            self.running += 1
            try:
                yield slot
            finally:
                self.running -= 1

    def answered(self, slot: Slot | None, prompt: str, out: str, answer: Any) -> None:
        """What a llama.cpp slot holds after its request, and the speed its timings show."""
        if slot is None or self.planner is None:
            return
        slot.text = prompt + out
        timings = (getattr(answer, "model_extra", None) or {}).get("timings")
        usage = getattr(answer, "usage", None)
        if isinstance(timings, dict) and usage is not None:
            self.planner.rates.observe(timings, len(prompt), usage.prompt_tokens or 0)
