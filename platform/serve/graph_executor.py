"""A session's DAG in motion: completion chains become tasks once their inputs exist.

Chains run as :class:`CompletionTask` s on the :class:`GlobalScheduler`; transform calls run
right here, on the ServeCore, when their inputs are ready.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from parrot.engines.protocol.errors import TransformError
from parrot.platform.serve import transforms
from parrot.platform.serve.executor import THROUGHPUT, CompletionTask, GlobalScheduler
from parrot.platform.serve.graph import CompletionChain, TransformGen


class GraphExecutor:
    """Turns a session's chains into tasks as their inputs become ready."""

    def __init__(self, session_id: str, scheduler: GlobalScheduler, seq: itertools.count) -> None:
        self.session_id = session_id
        self.scheduler = scheduler
        self.variables = scheduler.variables
        self.seq = seq
        self.app_seq: int | None = None  # when this session's first task arrived
        self._watchers: set[asyncio.Task] = set()

    def submit(
        self, chains: list[CompletionChain], models: tuple[str, ...] = (), criteria: str = THROUGHPUT
    ) -> None:
        for chain in chains:
            watcher = asyncio.create_task(self._when_ready(chain, models, criteria))
            self._watchers.add(watcher)
            watcher.add_done_callback(self._watchers.discard)

    async def _when_ready(self, chain: CompletionChain, models: tuple[str, ...], criteria: str) -> None:
        if chain.gen.var.ready or chain.gen.var.error:
            return  # settled before a restart: nothing to run
        waits = list(chain.input_vars())
        if chain.previous is not None:
            waits.append(chain.previous.gen.var)
        failed = None
        for var in waits:
            await self.variables.event(var).wait()
            if var.error:
                failed = f"input {var.name!r} failed: {var.error}"
                break
        if failed is not None:
            self.variables.fail(chain.gen.var, failed)
            return
        if isinstance(chain.gen, TransformGen):
            self._transform(chain, chain.gen)
            return
        # Chains whose outputs feed one consumer form a group scheduled together.
        consumers = {id(c.request) for c in chain.gen.var.consumers}
        group = min(consumers) if consumers else None
        seq = next(self.seq)
        if self.app_seq is None:
            self.app_seq = seq
        task = CompletionTask(chain, self.session_id, seq, criteria, group, models, app_seq=self.app_seq)
        self.scheduler.submit(task)

    def _transform(self, chain: CompletionChain, gen: TransformGen) -> None:
        """Transforms run here, at once: microseconds of string work need no engine."""
        chain.request.engine_id = "servecore"
        chain.request.timings.setdefault("started_at", time.time())
        try:
            value = transforms.apply(gen.steps, [v.value or "" for v in chain.input_vars()])
        except TransformError as error:
            self.variables.fail(gen.var, str(error))
        else:
            self.variables.set_value(gen.var, value)

    def cancel(self) -> None:
        for watcher in list(self._watchers):
            watcher.cancel()
