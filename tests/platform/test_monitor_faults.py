"""The engine monitor is a loop nobody awaits: a failure it did not expect must neither end
it (engines would never be marked down or up again) nor leave a failing engine up."""

from __future__ import annotations

import asyncio

from parrot.platform.serve.contexts.manager import ContextManager
from parrot.platform.serve.contexts.tree import ContextTree, MemoryPressure, context_ids
from parrot.platform.serve.scheduler.health import EngineMonitor, HealthSettings
from parrot.platform.serve.scheduler.slot import EngineSlot


class OddEngine:
    """An engine client whose ping fails in a way no one planned for (a unit-test fake)."""

    async def ping(self, timeout_s: float) -> dict:
        raise KeyError("max_running")


async def test_an_unexpected_ping_failure_is_a_missed_ping_and_the_monitor_goes_on():
    rounds, downs = [], []
    monitor = EngineMonitor(
        HealthSettings(interval_s=0.01, max_missed=2),
        ContextManager(MemoryPressure(), text_chars=0),
        on_down=downs.append,
        on_up=lambda slot: None,
        queued=lambda slot: [],
        fixed_limit=lambda slot: None,
        on_round=lambda: rounds.append(1),
    )
    slot = EngineSlot("engine-1", "m", OddEngine(), ContextTree(context_ids()))
    runner = asyncio.create_task(monitor.run(lambda: [slot]))
    try:
        for _ in range(200):
            if len(rounds) >= 4:
                break
            await asyncio.sleep(0.01)
    finally:
        runner.cancel()
    assert not runner.done() or runner.cancelled()
    assert len(rounds) >= 4, "the monitor stopped after an unexpected error"
    assert not slot.up and downs == [slot]
