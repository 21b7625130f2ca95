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
  engines of their own (scheduler/roles.py).

A task goes to the engine with the least work ahead of it: the tokens its running tasks may
still add, plus the prompt tokens it would have to compute. (The paper packs throughput
tasks onto the fullest engine that fits, which pays where a larger batch costs nothing;
on engines whose step time grows with the batch, as on a CPU, packing left the other
engines idle: 0.49x the baseline on two engines in the mixed benchmark.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parrot.platform.serve.scheduler.roles import RoleSettings
from parrot.platform.serve.scheduler.task import CompletionTask


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
            (task.group is None, task.group or (0, 0)) if self.task_groups else (False, (0, 0)),
            task.app_seq if self.app_fifo else 0,
            task.seq,
        )

    def priority(self, task: CompletionTask) -> int:
        """The engine-side priority of the task's jobs."""
        return 1 if self.criteria and task.latency else 0

    def placement(self, task: CompletionTask, matched: int, load: int, prompt: int) -> int:
        """Sort key of candidate engines (smallest wins): the work ahead of the task there,
        in tokens (``load``: what its running tasks may add; ``prompt``: the task's prompt,
        of which ``matched`` is cached there)."""
        return load + prompt - (matched if self.context_affinity else 0)
