"""The engine monitor: pings, down and up, capacity and memory pressure.

Every engine is pinged every ``interval_s``, all at once, each ping bounded by
``timeout_s``: an engine that stops answering (killed, or stopped and still holding its
port) misses pings and after ``max_missed`` is marked down within seconds; its running
tasks leave it at once and run elsewhere. When it answers again it is up, and whatever its
earlier contexts left on it is freed. Each ping also carries the engine's capacity (KV
size, running-job limit) and KV usage: the context manager is asked to relieve its memory
(above the pressure mark, contexts no task needs are freed least recently used first).
The monitor itself changes no context.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.contexts.manager import ContextManager
from parrot.platform.serve.scheduler.slot import EngineSlot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthSettings:
    interval_s: float = 1.0  # between two rounds of pings
    timeout_s: float = 2.0  # one ping may take this long
    max_missed: int = 2  # missed pings in a row before an engine is down
    # A task whose every engine is down waits this long for one to come back, then fails.
    down_grace_s: float = 15.0
    # Text contexts (OpenAI engines) kept at most, in characters, before the oldest go.
    text_chars: int = 64 * 2**20
    request_timeout_s: float = 600.0  # one request to an engine may take this long
    # A fork of a context whose own request is still on its way to the engine waits this long.
    parent_wait_s: float = 10.0
    openai_capacity: int = 16  # requests at once on an OpenAI endpoint registered without one

    def __post_init__(self) -> None:
        positive = (
            self.interval_s, self.timeout_s, self.max_missed, self.down_grace_s,
            self.request_timeout_s, self.parent_wait_s, self.openai_capacity,
        )
        if min(positive) <= 0 or self.text_chars < 0:
            raise ValueError("health settings must be positive")


class EngineMonitor:
    def __init__(
        self,
        settings: HealthSettings,
        contexts: ContextManager,
        on_down: Callable[[EngineSlot], None],
        on_up: Callable[[EngineSlot], None],
        queued: Callable[[EngineSlot], list[Sequence]],
        fixed_limit: Callable[[EngineSlot], int | None],
        on_round: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.contexts = contexts
        self.on_down = on_down
        self.on_up = on_up
        self.queued = queued  # the prompts of the queued tasks (never evicted from under them)
        self.fixed_limit = fixed_limit  # a configured task limit (None: the engine's own)
        self.on_round = on_round  # after each round of pings

    @property
    def evicted(self) -> int:
        return self.contexts.evicted

    async def run(self, slots: Callable[[], list[EngineSlot]]) -> None:
        while True:
            results = await asyncio.gather(*(self.check(s) for s in slots()), return_exceptions=True)
            for error in results:  # a bug in one engine's check must not end the monitoring
                if isinstance(error, Exception):
                    log.error("engine health check failed: %r", error)
            self.on_round()
            await asyncio.sleep(self.settings.interval_s)

    async def check(self, slot: EngineSlot) -> None:
        try:
            info = await asyncio.wait_for(slot.client.ping(self.settings.timeout_s), self.settings.timeout_s)
        except Exception as error:  # a ParrotError, a timeout, or an answer nobody expected
            if not isinstance(error, ParrotError | TimeoutError):
                log.warning("engine %s: unexpected ping failure %r", slot.engine_id, error)
            slot.missed_pings += 1
            if slot.up and slot.missed_pings >= self.settings.max_missed:
                log.warning("engine %s missed %d pings (%s): down", slot.engine_id, slot.missed_pings, error)
                slot.mark_down()
                self.contexts.engine_lost(slot)
                self.on_down(slot)
            return
        slot.missed_pings = 0
        slot.update(info, self.fixed_limit(slot))
        if not slot.up:
            log.info("engine %s answers again: up", slot.engine_id)
            slot.mark_up()
            await self.contexts.free_stale(slot)
            self.on_up(slot)
        await self.contexts.relieve(slot, self.queued(slot))
