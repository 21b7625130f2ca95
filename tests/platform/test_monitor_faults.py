"""The engine monitor is a loop nobody awaits: a failure it did not expect must neither end
it (engines would never be marked down or up again) nor leave a failing engine up."""

from __future__ import annotations

import asyncio

from parrot.platform.serve.contexts.manager import ContextManager
from parrot.platform.serve.contexts.tree import MemoryPressure
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.health import HealthSettings
from parrot.platform.serve.scheduler.slot import EngineSlot


class OddEngine:
    """An engine client whose ping fails in a way no one planned for (a unit-test fake)."""

    def __init__(self) -> None:
        self.pings = 0

    async def ping(self, timeout_s: float) -> dict:
        self.pings += 1
        raise KeyError("max_running")


async def test_an_unexpected_ping_failure_is_a_missed_ping_and_the_monitor_goes_on():
    scheduler = GlobalScheduler(
        None, ContextManager(MemoryPressure()), health=HealthSettings(interval_s=0.01)
    )
    engine = OddEngine()
    slot = EngineSlot("engine-1", "m", engine)
    scheduler.add_engine(slot)
    scheduler.start()
    try:
        for _ in range(200):
            if engine.pings >= 4:
                break
            await asyncio.sleep(0.01)
        loops_alive = all(not loop.done() for loop in scheduler._loops)
    finally:
        await scheduler.stop()
    assert engine.pings >= 4, "the monitor stopped after an unexpected error"
    assert loops_alive and not slot.up and slot.missed_pings >= 2
