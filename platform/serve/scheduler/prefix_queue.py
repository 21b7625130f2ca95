"""A task that waits at the replica holding its prefix instead of spilling to another.

A llama.cpp replica's slots bound the tasks the scheduler places on it (its ``task_limit``).
Once they are taken, a task sharing a long prefix with what they hold would go to another
replica with room, which computes the whole prefix again, or wait in the ServeCore's queue
for the first replica to free, often another one. A replica whose engine plans its slots
(engines/openai/slots.py) can say from the server's own speed whether the task had better
wait there for the slot holding its prefix: then it is placed there past the limit (at most
:data:`QUEUE_ROOM` tasks past it), and the engine queues it for that slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import CompletionTask

QUEUE_ROOM = 4  # tasks a replica takes past its slots (its engine's waiters for one slot)
MIN_GAIN = 1024  # characters (~256 tokens) its prefix there must save over the alternative


def prefix_queue(
    task: CompletionTask,
    ready: Sequence[EngineSlot],
    free: Sequence[EngineSlot],
    matched: Callable[[EngineSlot, Sequence], int],
) -> EngineSlot | None:
    """The full replica of ``ready`` where ``task`` had better wait for the slot holding
    its prefix than run on the best other engine (a free one, else the least busy), if any."""
    full = [s for s in ready if s not in free and _queues(s)]
    for slot in sorted(full, key=lambda s: -matched(s, task.prompts[s.prompt_key].symbols)):
        others = [s for s in (free or ready) if s is not slot and s.prompt_key == slot.prompt_key]
        if not others:
            return None
        prompt = task.prompts[slot.prompt_key].symbols
        elsewhere = max(
            others, key=lambda s: (matched(s, task.prompts[s.prompt_key].symbols), -len(s.running))
        )
        there = matched(elsewhere, task.prompts[elsewhere.prompt_key].symbols)
        if matched(slot, prompt) - there < MIN_GAIN:
            continue
        if slot.client.worth_queueing(prompt, there, len(elsewhere.running)):
            return slot
    return None


def _queues(slot: EngineSlot) -> bool:
    """A replica that plans its slots, with room in its queue."""
    return (
        slot.up
        and slot.text
        and hasattr(slot.client, "worth_queueing")
        and len(slot.running) < slot.task_limit + QUEUE_ROOM
    )
