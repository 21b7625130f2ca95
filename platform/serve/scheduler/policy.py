"""The scheduling policies: the order of the ready queue and where a task runs.

Each policy is on by default and can be switched off (``parrot serve --no-...``):

- ``criteria``: latency-critical tasks (a latency ``get`` downstream, or ``latency``
  output criteria) go first, the deepest upstream first, to the least loaded engine, with a
  higher priority in the engine's own queue; throughput tasks fill engines up.
- ``task_groups``: the tasks one consumer waits on together are ordered and placed together,
  groups by their application's start.
- ``app_fifo``: the tasks of applications that started first go first.
- ``context_affinity``: the engine holding the longest prefix of the prompt wins, and queued
  tasks that share a prefix with a task just placed follow it to its engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from parrot.platform.serve.scheduler.task import CompletionTask


@dataclass(frozen=True)
class SchedulingPolicy:
    app_fifo: bool = True
    task_groups: bool = True
    context_affinity: bool = True
    criteria: bool = True
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

    def placement(self, task: CompletionTask, matched: int, load: int) -> tuple:
        """Sort key of candidate engines (smallest wins): the longest cached prefix, then the
        least loaded for latency, the most loaded that still fits for throughput."""
        affinity = -matched if self.context_affinity else 0
        if self.criteria and not task.latency:
            return (affinity, -load)
        return (affinity, load)
