"""The engine monitor: pings, down and up, capacity and memory pressure.

Every engine is pinged every ``interval_s``, all at once, each ping bounded by
``timeout_s``: an engine that stops answering (killed, or stopped and still holding its
port) misses pings and after ``max_missed`` is marked down within seconds; its running
tasks leave it at once and run elsewhere. When it answers again it is up, and whatever its
earlier contexts left on it is freed. Each ping also carries the engine's capacity (KV
size, running-job limit) and KV usage: above the pressure mark, contexts no task needs are
freed least recently used first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.contexts import EngineContext, MemoryPressure, free_on_engine
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
        pressure: MemoryPressure,
        on_down: Callable[[EngineSlot], None],
        on_up: Callable[[EngineSlot], None],
        keep: Callable[[EngineSlot], set[int]],
        fixed_limit: Callable[[EngineSlot], int | None],
        on_round: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.pressure = pressure
        self.on_down = on_down
        self.on_up = on_up
        self.keep = keep  # contexts queued tasks will fork from (never evicted)
        self.fixed_limit = fixed_limit  # a configured task limit (None: the engine's own)
        self.on_round = on_round  # after each round of pings
        self.evicted = 0

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
                self.on_down(slot)
            return
        slot.missed_pings = 0
        slot.update(info, self.fixed_limit(slot))
        if not slot.up:
            log.info("engine %s answers again: up", slot.engine_id)
            slot.mark_up()
            await self._free_stale(slot)
            self.on_up(slot)
        await self.relieve(slot)

    async def relieve(self, slot: EngineSlot) -> int:
        """Free contexts no task needs, least recently used first, while the engine's KV use
        is above the pressure mark, or the contexts held exceed what the engine can hold."""
        tree = slot.contexts
        info = slot.info
        total, used, block = info.get("kv_blocks_total"), info.get("kv_blocks_used"), info.get("block_size")
        to_free = 0  # symbols
        if total and block and used is not None and used > self.pressure.high * total:
            to_free = int((used - self.pressure.low * total) * block)
        limit = self.settings.text_chars if slot.text else slot.token_capacity
        if limit is not None:
            to_free = max(to_free, tree.held_symbols() - limit)
        if to_free <= 0:
            return 0
        protected = self.keep(slot)
        gone: list[EngineContext] = []
        for ctx in tree.evictable(protected):
            if to_free <= 0:
                break
            to_free -= tree.remove(ctx)  # what only it held: a fork's parent part is not counted
            gone.append(ctx)
        self.evicted += len(gone)
        await free_on_engine(slot.client, [c.context_id for c in gone])
        return len(gone)

    async def _free_stale(self, slot: EngineSlot) -> None:
        while slot.stale:
            tree = slot.stale.pop()
            with contextlib.suppress(ParrotError):
                await free_on_engine(slot.client, list(tree.contexts))
