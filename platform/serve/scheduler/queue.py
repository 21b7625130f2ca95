"""The ready queue: tasks whose inputs all have values, waiting for an engine."""

from __future__ import annotations

from collections.abc import Iterator

from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.task import CompletionTask


class TaskQueue:
    def __init__(self, policy: SchedulingPolicy) -> None:
        self.policy = policy
        self._tasks: dict[str, CompletionTask] = {}  # by chain key, in arrival order

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task: CompletionTask) -> bool:
        return self._tasks.get(task.key) is task

    def __iter__(self) -> Iterator[CompletionTask]:
        return iter(list(self._tasks.values()))

    def add(self, task: CompletionTask) -> None:
        self._tasks[task.key] = task

    def remove(self, task: CompletionTask) -> None:
        if self._tasks.get(task.key) is task:
            del self._tasks[task.key]

    def ordered(self) -> list[CompletionTask]:
        """The tasks in the order the policies give (criteria, groups, app-FIFO, arrival)."""
        return sorted(self._tasks.values(), key=self.policy.order)

    def in_group(self, group: tuple[int, int]) -> list[CompletionTask]:
        return sorted((t for t in self._tasks.values() if t.group == group), key=self.policy.order)

    def take_session(self, session_id: str) -> list[CompletionTask]:
        """Remove and return the session's queued tasks."""
        gone = [t for t in self._tasks.values() if t.session_id == session_id]
        for task in gone:
            del self._tasks[task.key]
        return gone
