"""An engine as the scheduler sees it: its model, load, capacity and health.

The scheduler (platform/serve/scheduler/global_scheduler.py) is the one writer of a slot's
state: the tasks placed on it and their load, and, from the monitor's pings, its health and
capacity. The contexts it holds are the context manager's (platform/serve/contexts/), kept
there by slot; a registry only builds a slot and hands it to the scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from parrot.platform.serve.engines.client import Engine
from parrot.platform.serve.engines.tokenizers import Tokenize
from parrot.platform.serve.scheduler.task import CompletionTask, PromptKey


@dataclass(eq=False)
class EngineSlot:
    engine_id: str
    model: str
    client: Engine
    text: bool = False  # its contexts are text (an OpenAI endpoint), else token ids
    tokenize: Tokenize | None = None  # the engine's own /tokenize (None: text contexts)
    # Tasks at once: the configured cap for an OpenAI endpoint, else the engine's own
    # ``max_running`` from its ping (until the first ping: this default).
    task_limit: int = 16
    token_capacity: int | None = None  # KV tokens the engine holds (from its ping)
    up: bool = True
    missed_pings: int = 0
    info: dict = field(default_factory=dict)  # the last ping
    running: dict[str, CompletionTask] = field(default_factory=dict)  # by chain key
    load: int = 0  # KV tokens the running tasks may add (their need)
    throughput_load: int = 0  # the part of ``load`` that is throughput tasks'
    latency_running: set[str] = field(default_factory=set)  # keys of latency-critical tasks
    latency_ended_at: float = float("-inf")  # monotonic time the last of them ended
    tails: dict[str, str] = field(default_factory=dict)  # running throughput tails: key -> session
    tail_ended: tuple[str, float] = ("", float("-inf"))  # the last tail's session, monotonic end
    placed: int = 0  # tasks placed here so far: among engines alike, the one given fewest

    @property
    def latency_tasks(self) -> int:
        return len(self.latency_running)

    @property
    def prompt_key(self) -> PromptKey:
        return (self.model, self.text)

    def throughput_left(self) -> int:
        """Tokens its throughput tasks have yet to compute (``throughput_load`` counts what
        they were placed with: a batch near its end still counts whole there)."""
        return sum(t.left(self.prompt_key) for k, t in self.running.items() if k not in self.latency_running)

    def fits(self, need: int) -> bool:
        """Room for one more task needing ``need`` KV tokens (an idle engine takes any)."""
        if len(self.running) >= self.task_limit:
            return False
        if self.token_capacity is None or not self.running:
            return True
        return self.load + need <= self.token_capacity

    def take(self, task: CompletionTask, need: int) -> None:
        """``task`` was placed here, and may add ``need`` KV tokens."""
        self.running[task.key] = task
        self.placed += 1
        self.load += need
        if task.latency:  # as placed (a latency get may come while it runs): see release
            self.latency_running.add(task.key)
        else:
            self.throughput_load += need
            if task.tail:
                self.tails[task.key] = task.session_id

    def release(self, task: CompletionTask, need: int) -> bool:
        """``task`` left (done, failed or moved); True if it was latency-critical here, or
        the end of an application's critical path (what the engine may take changes after a
        while: policy.EngineRoles)."""
        self.running.pop(task.key, None)
        self.load -= need
        if task.key in self.latency_running:
            self.latency_running.discard(task.key)
            self.latency_ended_at = time.monotonic()
            return True
        self.throughput_load -= need
        if self.tails.pop(task.key, None) is None or task.group is None:
            return False
        self.tail_ended = (task.session_id, time.monotonic())  # the group's consumer comes next
        return True
