"""The ready queue: tasks whose inputs all have values, waiting for an engine."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.task import CompletionTask, PromptKey


class TaskQueue:
    def __init__(self, policy: SchedulingPolicy) -> None:
        self.policy = policy
        self._tasks: dict[str, CompletionTask] = {}  # by chain key, in arrival order
        # Counted once a dispatch pass, then kept as tasks leave (see recount): throughput
        # tokens waiting per kind of engine, and tasks waiting per task group.
        self._waiting: Counter | None = None
        self._groups: Counter = Counter()

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task: CompletionTask) -> bool:
        return self._tasks.get(task.key) is task

    def __iter__(self) -> Iterator[CompletionTask]:
        return iter(list(self._tasks.values()))

    def add(self, task: CompletionTask) -> None:
        self._tasks[task.key] = task
        self._waiting = None

    def remove(self, task: CompletionTask) -> None:
        if self._tasks.get(task.key) is task:
            del self._tasks[task.key]
            if self._waiting is not None:
                self._groups[task.group] -= 1
                if not task.latency:
                    self._waiting.subtract({key: task.need(key) for key in task.prompts})

    def recount(self) -> None:
        """Count afresh at the next question (a dispatch pass begins: prompts were made,
        groups formed and criteria changed since the last). Counting at each placement
        would make a pass over a long queue quadratic."""
        self._waiting = None

    def _counted(self) -> Counter:
        if self._waiting is None:
            self._waiting = Counter()
            self._groups = Counter(task.group for task in self._tasks.values())
            for task in self._tasks.values():
                if not task.latency:
                    self._waiting.update({key: task.need(key) for key in task.prompts})
        return self._waiting

    def waiting_throughput(self, key: PromptKey) -> int:
        """Tokens the queued throughput tasks may add on an engine of ``key`` (prompts and
        outputs)."""
        return self._counted()[key]

    def ordered(self) -> list[CompletionTask]:
        """The tasks in the order the policies give (criteria, app-FIFO, groups, arrival)."""
        return sorted(self._tasks.values(), key=self.policy.order)

    def in_group(self, group: tuple[int, int]) -> list[CompletionTask]:
        return sorted((t for t in self._tasks.values() if t.group == group), key=self.policy.order)

    def ends_group(self, task: CompletionTask) -> bool:
        """Whether ``task`` (just taken out) was the last of its task group here."""
        if task.group is None:
            return False
        self._counted()
        return self._groups[task.group] <= 0

    def take_session(self, session_id: str) -> list[CompletionTask]:
        """Remove and return the session's queued tasks."""
        gone = [t for t in self._tasks.values() if t.session_id == session_id]
        for task in gone:
            del self._tasks[task.key]
        self._waiting = None
        return gone
