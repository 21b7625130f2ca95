"""Running one completion task on an engine: one engine request on the critical path.

The runner only talks to the engine: what to send comes from the task's lease
(:mod:`parrot.platform.serve.contexts.leases`), which it settles or discards. The task's
prompt forks from the engine context holding its longest prefix, at the length
matched (wherever it falls); the rest of the prompt and the generation go to the engine as
one ``generate`` request, which also keeps the prompt's shared prefixes (constant template
text) as checkpoint contexts of their own. The generation context then holds prompt and
output; it stays in the tree (a later call that starts with both forks from it) until its
session goes or memory is needed. If the engine is lost meanwhile, or a context the task
forked from vanished, the task runs again (elsewhere, if need be).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from parrot.engines.protocol.errors import ContextFreedError, EngineUnavailableError, UnknownContextError
from parrot.engines.protocol.schemas import StreamEnd
from parrot.platform.serve.calls.ledger import CallLedger
from parrot.platform.serve.contexts.leases import AheadLease, Lease, Result
from parrot.platform.serve.ops.metrics import ServeMetrics
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.prompt import Prompt, PromptBuilder
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import CompletionTask

log = logging.getLogger(__name__)


class Requeue(Exception):
    """The task did not run to its end through no fault of its own: run it again.
    ``engine_failed``: its engine failed a request (it is taken out until it answers pings)."""

    def __init__(self, reason: str, engine_failed: bool = False) -> None:
        super().__init__(reason)
        self.engine_failed = engine_failed


@dataclass
class SchedulerStats:
    done: int = 0
    failed: int = 0
    requeued: int = 0
    prompt_tokens: int = 0  # of started tasks
    reused_tokens: int = 0  # of those, forked from a context on the engine (prefix hits)
    filled_ahead: int = 0  # tokens filled before their call's inputs were all there
    evicted: int = 0  # contexts freed under memory pressure (the context manager counts; snapshots copy)


class TaskRunner:
    def __init__(
        self,
        prompts: PromptBuilder,
        policy: SchedulingPolicy,
        stats: SchedulerStats,
        metrics: ServeMetrics,
        parent_wait_ms: int,
        calls: CallLedger,
    ) -> None:
        self.prompts = prompts
        self.calls = calls  # told when a call's first token came
        self.policy = policy
        self.stats = stats
        self.metrics = metrics
        self.parent_wait_ms = parent_wait_ms  # a fork of a context whose request is in flight waits

    async def prompt(self, task: CompletionTask, slot: EngineSlot) -> Prompt:
        prompt = task.prompts.get(slot.prompt_key)
        if prompt is None:
            fetch = None if slot.text else slot.tokenize
            prompt = await self.prompts.build(task.chain, slot.model, fetch, slot.text)
            task.prompts[slot.prompt_key] = prompt
        return prompt

    async def run(self, task: CompletionTask, lease: Lease) -> Result:
        """Run the placed task; its lease is settled or discarded whatever happens."""
        slot = lease.slot
        started = time.monotonic()
        first_token: list[float] = []  # when its first token came
        try:
            result = await self._until_lost(slot, self._generate(task, lease, first_token))
        except (ContextFreedError, UnknownContextError) as error:  # a context it forked from went
            lease.discard()
            self._rerun(task, error)
            raise Requeue(str(error)) from None
        except EngineUnavailableError as error:
            lease.discard()
            self._rerun(task, error)
            raise Requeue(str(error), engine_failed=slot.up) from None
        except BaseException:
            lease.discard()
            raise
        lease.settle(result)
        if not slot.text:
            task.chain.prompt_ids_by_model[slot.model] = list(lease.prompt.symbols)
        self.stats.done += 1
        ttft = first_token[0] - started if first_token else None
        self.metrics.observe_task(time.monotonic() - started, ttft, len(result.token_ids))
        return result

    @staticmethod
    def _rerun(task: CompletionTask, error: Exception) -> None:
        """The task will run again, unless a client already saw some of its text (a rerun
        would repeat it, or say something else): then ``error`` fails it."""
        stream = task.gen.var.stream
        if task.streamed or stream.seen:
            raise error
        stream.restart()

    async def fill(self, lease: AheadLease, latency: bool) -> None:
        """Fill a waiting chain's known prefix ahead (its lease says what to send)."""
        await lease.slot.client.fill(
            lease.context.context_id,
            **lease.request(),
            parent_context_id=lease.parent_id,
            priority=1 if latency and self.policy.criteria else 0,
            parent_timeout_ms=self.parent_wait_ms if lease.parent_pending else 0,
            background=not latency,  # rides along the steps running work leaves room in
        )

    async def _generate(self, task: CompletionTask, lease: Lease, first_token: list[float]) -> Result:
        slot, gen = lease.slot, task.gen
        args = {
            **lease.request(),
            # Its parent's own request may still be on its way to the engine.
            "parent_timeout_ms": self.parent_wait_ms if lease.parent_pending else 0,
            "priority": self.policy.priority(task),
        }
        cid, parent_id = lease.context.context_id, lease.parent_id
        # Always streamed from the engine: whoever follows the variable sees its text as it
        # is written (GET /v1/semantic_var/{id}/stream), and its first token is timed.
        stream = gen.var.stream
        async for event in slot.client.generate_stream(cid, gen.sampling, parent_id, **args):
            if isinstance(event, StreamEnd):
                return event
            if not first_token:
                first_token.append(time.monotonic())
                self.calls.first_token(task.chain.request)
            stream.append(event.text)
            if event.text and gen.on_token is not None:
                task.streamed = True
                gen.on_token(event.text)
        raise EngineUnavailableError(f"engine {slot.engine_id} ended a stream without its end event")

    @staticmethod
    async def _until_lost(slot: EngineSlot, work: Awaitable[Result]) -> Result:
        """``work``, unless the engine is marked down first (a hung engine answers nothing:
        its tasks must not wait for an HTTP timeout)."""
        job = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(slot.lost.wait())
        try:
            await asyncio.wait({job, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not job.done():
                job.cancel()
        if job.done() and not job.cancelled():
            return job.result()
        raise EngineUnavailableError(f"engine {slot.engine_id} stopped answering its pings")
