"""The scheduling policies: the order of the ready queue and where a task runs.

Each policy is on by default and can be switched off (``parrot serve --no-...``):

- ``criteria``: latency-critical tasks (a latency ``get`` downstream, or ``latency``
  output criteria) go first, the deepest upstream first, with a higher priority in the
  engine's own queue.
- ``task_groups``: the tasks one consumer waits on together are ordered and placed together,
  groups by their application's start.
- ``app_fifo``: the tasks of applications that started first go first.
- ``context_affinity``: an engine's cached prefix of the prompt counts as work it need not
  do, and queued tasks that share a prefix with a task just placed follow it to its engine.
- ``engine_roles``: with two engines or more, latency-critical and throughput tasks keep to
  engines of their own (:class:`EngineRoles`, below).

One rule is not a switch: a task whose long prefix a full llama.cpp replica holds may wait
there, past its slots, instead of spilling to another replica (:func:`prefix_queue`).

A task goes to the engine with the least work ahead of it: the tokens its running tasks may
still add, plus the prompt tokens it would have to compute. (The paper packs throughput
tasks onto the fullest engine that fits, which pays where a larger batch costs nothing;
on engines whose step time grows with the batch, as on a CPU, packing left the other
engines idle: 0.49x the baseline on two engines in the mixed benchmark.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import CompletionTask, PromptKey

DEFAULT_STEP_TOKENS = 1024  # an engine's step budget when its pings do not say (OpenAI engines)


@dataclass(frozen=True)
class RoleSettings:
    memory_s: float = 0.5
    # Latency tasks gathered on one engine before the next takes them: a CPU engine decodes
    # 4 rows in one pass over its packed weights, 8 in two.
    pack: int = 8
    window_steps: int = 2


@dataclass(frozen=True)
class SchedulingPolicy:
    app_fifo: bool = True
    task_groups: bool = True
    context_affinity: bool = True
    criteria: bool = True
    engine_roles: bool = True
    roles: RoleSettings = field(default_factory=RoleSettings)
    # A prompt that shares at least this many tokens with a task just placed goes with it.
    cluster_min_shared: int = 64

    def order(self, task: CompletionTask) -> tuple:
        """Sort key of the ready queue (smallest first)."""
        return (
            (not task.latency, -task.depth) if self.criteria else (False, 0),
            # An application's own tasks (its reduce) before a later one's groups (its maps).
            task.app_seq if self.app_fifo else 0,
            (task.group is None, task.group or (0, 0)) if self.task_groups else (False, (0, 0)),
            task.seq,
        )

    def priority(self, task: CompletionTask) -> int:
        """The engine-side priority of the task's jobs."""
        return 1 if self.criteria and task.latency else 0

    def placement(self, task: CompletionTask, matched: int, load: int, prompt: int) -> int:
        """Sort key of candidate engines (smallest wins): the work ahead of the task there,
        in tokens (``load``: what its running tasks may add; ``prompt``: the task's prompt,
        of which ``matched`` is cached there). A prefix shorter than ``cluster_min_shared``
        (a template's first words) does not count: engines alike then get distinct prompts in
        turn, instead of one engine all prompts that start the same way."""
        shared = matched if self.context_affinity and matched >= self.cluster_min_shared else 0
        return load + prompt - shared


class EngineRoles:
    """Engine roles: with two engines or more, latency-critical and throughput work keep apart.

    On an engine whose step time grows with the work in it (a CPU at every batch; a GPU's
    prefill), a chat's tokens come only as fast as the steps they share: a map's 256-token
    prompt beside a chat's decode makes its step five times longer on this project's CPU. With
    several engines the ServeCore gives them the design's roles (latency engines lightly
    loaded, throughput engines batched large) from what runs where, with nothing to configure:

    - an engine is a *latency engine* while it runs latency-critical tasks and for
      ``memory_s`` after its last one ended (a chat user's next question comes right after the
      answer: the engine must not fill up with throughput work in between);
    - a latency-critical task goes to the engine with the least throughput work on it, and
      among those first to a latency engine with fewer than ``pack`` latency tasks: latency
      work gathers on few engines, so that the others stay free for throughput work;
    - a throughput task goes only to engines that are not latency engines, to each up to
      ``window_steps`` steps' budget of throughput work (from its pings; the engine batches
      that much, more only waits there): the rest waits in the ServeCore's queue, where an
      engine whose latency work ends can take it instead of watching another engine work
      through everything. When every engine is a latency engine they share the throughput
      work by the usual placement.

    - a CPU engine running the end of an application's critical path (the last tasks of a
      task group to leave the queue, or the consumer that waits on a group: a reduce)
      takes no other application's throughput work while it runs, nor for ``memory_s``
      after a group's last task (its consumer comes next: :meth:`keeps_to_another`). A CPU
      step's time grows with its rows: the last map of the first application in the mixed
      benchmark shared a batch with six maps of the second and finished after 4.5 s instead
      of ~1 s, and its reduce then waited behind the second's maps (on a GPU, rows beside
      it cost the tail little, and keeping engines to single tails would cost throughput);
    - at the end of the throughput work, an engine takes no more than its fair share of
      what is left (:meth:`within_share`): taking a whole window left the other engine idle
      for the last 2 s of that benchmark while its maps ran.

    The window counts a task's output with its prompt, so an engine runs its throughput
    work in batches. Counting only the prompts still to compute (until a task's first
    token) let an engine take new prompts beside its running tasks' decodes, whose every
    token then waited for a 1,024-token prefill step: the mixed benchmark's map-reduce on
    two engines went 0.89x -> 0.75x of the baseline's.

    With one engine there are no roles: what the engine runs at once is its own scheduler's
    choice (``--latency-max-prefill-tokens``). ``parrot serve --no-engine-roles`` turns them off.
    """

    def __init__(
        self,
        settings: RoleSettings | None = None,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or RoleSettings()
        self.enabled = enabled  # (the criteria policy off: no task is latency-critical)
        self.clock = clock

    def is_latency_engine(self, slot: EngineSlot) -> bool:
        return slot.latency_tasks > 0 or self.clock() - slot.latency_ended_at < self.settings.memory_s

    def window(self, slot: EngineSlot) -> int:
        """Tokens of throughput work an engine takes at once: its steps' budget, twice."""
        step = int(slot.info.get("max_batched_tokens") or DEFAULT_STEP_TOKENS)
        return self.settings.window_steps * step

    def admissible(
        self,
        task: CompletionTask,
        up: list[EngineSlot],
        free: list[EngineSlot],
        need: Callable[[EngineSlot], int],
        waiting: Callable[[PromptKey], int] = lambda key: 0,
    ) -> list[EngineSlot]:
        """The engines of ``free`` (those with room, of the engines ``up`` that serve the
        task's models) that may take ``task`` now; none: it waits in the queue.
        ``waiting``: the throughput tokens queued for a kind of engine, ``task``'s included."""
        if not self.enabled or len(up) < 2 or task.latency:
            return free
        plain = [s for s in up if not self.is_latency_engine(s)]
        if not plain:
            return free  # every engine serves latency work: they share the rest
        return [s for s in free if s in plain and self.takes_throughput(task, s, need(s), plain, waiting)]

    def takes_throughput(
        self,
        task: CompletionTask,
        slot: EngineSlot,
        need: int,
        plain: Sequence[EngineSlot],
        waiting: Callable[[PromptKey], int],
    ) -> bool:
        """Whether ``slot`` takes the throughput ``task`` (adding ``need``): unless it keeps
        to another application's critical path, one task always fits an engine without
        throughput work, more up to its window and its fair share."""
        if self.keeps_to_another(slot, task.session_id):
            return False
        if slot.throughput_load == 0:
            return True
        if slot.throughput_load + need > self.window(slot):
            return False
        return self.within_share(slot, need, plain, waiting)

    def within_share(
        self, slot: EngineSlot, need: int, plain: Sequence[EngineSlot], waiting: Callable[[PromptKey], int]
    ) -> bool:
        """Whether a task adding ``need`` keeps ``slot`` within its fair share of the
        throughput work left (at least half of the task fits): what is queued and what the
        engines' running throughput tasks have yet to compute, over the engines that may
        take it."""
        left = {s: s.throughput_left() for s in plain if s.prompt_key == slot.prompt_key}
        if len(left) < 2:
            return True
        share = (waiting(slot.prompt_key) + sum(left.values())) / len(left)
        return left[slot] + need / 2 <= share

    def keeps_to_another(self, slot: EngineSlot, session_id: str) -> bool:
        """Whether ``slot``, a CPU engine, keeps to another application's critical path: its
        end runs there, or a group's last task ended there under ``memory_s`` ago (its
        consumer is on its way to the queue: the value is stored first). Not for a tail with
        more than a window of work left: a long reduce would hold the engine for long."""
        if not slot.info.get("cpu"):
            return False
        others = [key for key, session in slot.tails.items() if session != session_id]
        if others:
            return sum(slot.running[key].left(slot.prompt_key) for key in others) <= self.window(slot)
        session, ended_at = slot.tail_ended
        return session != session_id and self.clock() - ended_at < self.settings.memory_s

    def rank(self, task: CompletionTask, slot: EngineSlot) -> tuple[int, int]:
        """The roles' part of the placement key (smallest first), before the work ahead.
        Latency work does not gather on an OpenAI endpoint (``slot.text``): what a step costs
        there is the server's business, and a llama.cpp replica of one thread ran four agent
        applications gathered on it while another replica idled (0.6x of round-robin)."""
        if not (self.enabled and task.latency) or slot.text:
            return (0, 0)
        gathering = self.is_latency_engine(slot) and slot.latency_tasks < self.settings.pack
        return (slot.throughput_load, 0 if gathering else 1)


# -- the prefix queue ----------------------------------------------------------------------
# A llama.cpp replica's slots bound the tasks placed on it (its ``task_limit``). Once they are
# taken, a task sharing a long prefix with what they hold would go to another replica with
# room, which computes the whole prefix again, or wait in the ServeCore's queue for the first
# replica to free, often another one (3 replicas on the chatbot: 6,014 prompt tokens computed
# against 2,757 on one). A replica whose engine plans its slots (engines/openai/slots.py) can
# say from the server's own speed whether the task had better wait there for the slot holding
# its prefix: then it is placed there past the limit, and the engine queues it for that slot.
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
