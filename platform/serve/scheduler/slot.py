"""An engine as the scheduler sees it: its model, contexts, load, capacity and health.

Its ``contexts`` tree is read by the scheduler (prefix matches) and the operator views;
only the context manager (platform/serve/contexts/manager.py) changes it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from parrot.platform.serve.contexts.tree import ContextTree
from parrot.platform.serve.engines.client import Engine
from parrot.platform.serve.engines.tokenizers import Tokenize
from parrot.platform.serve.scheduler.task import CompletionTask, PromptKey


@dataclass(eq=False)
class EngineSlot:
    engine_id: str
    model: str
    client: Engine
    contexts: ContextTree
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
    # Set when the engine is marked down: every task running on it leaves it at once.
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def text(self) -> bool:
        return self.contexts.text

    @property
    def prompt_key(self) -> PromptKey:
        return (self.model, self.text)

    def fits(self, need: int) -> bool:
        """Room for one more task needing ``need`` KV tokens (an idle engine takes any)."""
        if len(self.running) >= self.task_limit:
            return False
        if self.token_capacity is None or not self.running:
            return True
        return self.load + need <= self.token_capacity

    def mark_down(self) -> None:
        """The engine is gone: tasks on it leave (the context manager forgets its tree)."""
        self.up = False
        self.lost.set()

    def mark_up(self) -> None:
        self.up = True
        self.missed_pings = 0
        self.lost = asyncio.Event()

    def update(self, info: dict, fixed_limit: int | None) -> None:
        """Capacity from a ping: the engine's KV size and its running-job limit."""
        self.info = info
        total, block = info.get("kv_blocks_total"), info.get("block_size")
        if total and block:
            self.token_capacity = int(total) * int(block)
        if fixed_limit is None and info.get("max_running"):
            self.task_limit = int(info["max_running"])
