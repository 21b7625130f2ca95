"""The engine monitor: pings every engine and says what each answered.

Every engine is pinged every ``interval_s``, all at once, each ping bounded by
``timeout_s``. The monitor only asks: the scheduler applies each answer to its engine slot
(missed pings, down after ``max_missed`` in a row, up again, capacity and memory from the
ping), since it is the one writer of the slots.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.scheduler.slot import EngineSlot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthSettings:
    interval_s: float = 1.0  # between two rounds of pings
    timeout_s: float = 2.0  # one ping may take this long
    max_missed: int = 2  # missed pings in a row before an engine is down
    # A task whose every engine is down waits this long for one to come back, then fails.
    down_grace_s: float = 15.0

    def __post_init__(self) -> None:
        if min(self.interval_s, self.timeout_s, self.max_missed, self.down_grace_s) <= 0:
            raise ValueError("health settings must be positive")


@dataclass(frozen=True)
class Ping:
    """One engine's answer to a ping: its runtime info, or why it did not answer."""

    slot: EngineSlot
    info: dict | None
    error: BaseException | None = None


class EngineMonitor:
    def __init__(self, settings: HealthSettings) -> None:
        self.settings = settings

    async def ping_all(self, slots: Sequence[EngineSlot]) -> list[Ping]:
        return list(await asyncio.gather(*(self.ping(slot) for slot in slots)))

    async def ping(self, slot: EngineSlot) -> Ping:
        try:
            info = await asyncio.wait_for(slot.client.ping(self.settings.timeout_s), self.settings.timeout_s)
        except Exception as error:  # a ParrotError, a timeout, or an answer nobody expected
            if not isinstance(error, ParrotError | TimeoutError):
                log.warning("engine %s: unexpected ping failure %r", slot.engine_id, error)
            return Ping(slot, None, error)
        return Ping(slot, info)
