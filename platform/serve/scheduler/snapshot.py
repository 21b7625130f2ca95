"""What the scheduler shows outside itself: a read-only snapshot of its engines and counters.

Operator views (the dashboard, ``/metrics``, ``/healthz``, the load history, the activity
log) and the engine service read the scheduler only through the functions here, never its
queue, slots, running tasks or context trees directly: when the scheduler's insides change,
this module changes with them and its readers do not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from parrot.engines.protocol.errors import NotFoundError
from parrot.platform.serve.ops.observe import ContextTreeView, context_tree
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import SchedulerStats


@dataclass(frozen=True)
class EngineLoad:
    """One engine as the scheduler holds it now."""

    engine_id: str
    model: str
    up: bool
    running: int  # tasks placed on it now
    task_limit: int  # tasks at once
    contexts: int  # contexts the ServeCore holds on it
    missed_pings: int  # in a row
    info: dict  # its last ping (a copy)


@dataclass(frozen=True)
class SchedulerSnapshot:
    engines: list[EngineLoad]
    queued: int  # ready tasks waiting for an engine
    counters: SchedulerStats  # a copy

    @property
    def running(self) -> int:
        return sum(e.running for e in self.engines)


def take(scheduler: GlobalScheduler) -> SchedulerSnapshot:
    engines = [
        EngineLoad(
            engine_id=slot.engine_id,
            model=slot.model,
            up=slot.up,
            running=len(slot.running),
            task_limit=slot.task_limit,
            contexts=len(scheduler.contexts.tree(slot)),
            missed_pings=slot.missed_pings,
            info=dict(slot.info),
        )
        for slot in scheduler.engines.values()
    ]
    return SchedulerSnapshot(
        engines=engines,
        queued=len(scheduler.queue),
        counters=replace(scheduler.stats, evicted=scheduler.contexts.evicted),
    )


def queued(scheduler: GlobalScheduler) -> int:
    """Ready tasks waiting for an engine (what the activity log reports)."""
    return len(scheduler.queue)


def slots(scheduler: GlobalScheduler) -> list[EngineSlot]:
    """The engines' slots (for the engine service: their clients and health)."""
    return list(scheduler.engines.values())


def engine_contexts(scheduler: GlobalScheduler, engine_id: str) -> ContextTreeView:
    """The contexts held on an engine, as their prefix tree."""
    slot = scheduler.engines.get(engine_id)
    if slot is None:
        raise NotFoundError(f"engine {engine_id!r} is not registered")
    return context_tree(engine_id, slot.model, scheduler.contexts.tree(slot), dict(slot.info))
