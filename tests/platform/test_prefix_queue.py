"""A task waits at the llama.cpp replica holding its prefix, past its slots, instead of
spilling to another replica (issue 39): the rule of ``prefix_queue`` (platform/serve/scheduler/policy.py)
on engine slots whose engines answer the planner's estimate as the real one would (the
estimate itself: tests/engines/openai/test_slot_planner.py; two real llama-server replicas:
test_llama_fleet.py)."""

from __future__ import annotations

from types import SimpleNamespace

from parrot.platform.serve.scheduler.policy import QUEUE_ROOM, prefix_queue
from parrot.platform.serve.scheduler.slot import EngineSlot

PROMPT = "You are the librarian of a reading room. " * 60 + "Where is the atlas?"
KEY = ("m", True)


class Replica:
    """An engine whose planner says the task had better wait there (or not), and records
    what it was asked."""

    def __init__(self, worth: bool) -> None:
        self.worth, self.asked = worth, []

    def worth_queueing(self, prompt: str, elsewhere_shared: int, elsewhere_busy: int) -> bool:
        self.asked.append((elsewhere_shared, elsewhere_busy))
        return self.worth


def replica(name: str, running: int, worth: bool = True, limit: int = 4) -> EngineSlot:
    slot = EngineSlot(engine_id=name, model="m", client=Replica(worth), text=True, task_limit=limit)
    slot.running = {f"{name}-{i}": None for i in range(running)}
    return slot


def pick(slots: list[EngineSlot], held: dict[str, int]):
    task = SimpleNamespace(prompts={KEY: SimpleNamespace(symbols=PROMPT)})
    free = [s for s in slots if len(s.running) < s.task_limit]
    return prefix_queue(task, slots, free, lambda slot, _: held.get(slot.engine_id, 0))


def test_a_task_waits_where_its_prefix_is_when_its_engine_says_so():
    holding, idle = replica("a", running=4), replica("b", running=1)
    assert pick([holding, idle], {"a": 2400}) is holding
    assert holding.client.asked == [(0, 1)]  # what it would compute elsewhere, beside what runs there
    assert pick([replica("a", 4, worth=False), idle], {"a": 2400}) is None  # computing it again is quicker


def test_no_queue_without_a_long_prefix_a_queue_full_or_another_replica_holding_it():
    idle = replica("b", running=0)
    assert pick([replica("a", 4), idle], {"a": 500}) is None  # ~125 tokens: not worth a queue
    assert pick([replica("a", 4 + QUEUE_ROOM), idle], {"a": 2400}) is None  # its queue is full
    assert pick([replica("a", 4), idle], {"a": 2400, "b": 2400}) is None  # the free one holds it too
    assert pick([replica("a", 4)], {"a": 2400}) is None  # one replica: nowhere else to go


def test_with_every_replica_full_it_compares_with_the_least_busy():
    holding, other = replica("a", running=4), replica("b", running=4)
    assert pick([holding, other], {"a": 2400}) is holding and holding.client.asked == [(0, 4)]
    builtin = EngineSlot(engine_id="c", model="m", client=Replica(True), text=False)
    assert pick([builtin], {"c": 2400}) is None  # a builtin engine queues in its own scheduler
