"""Running one completion task on an engine: one engine request on the critical path.

The runner only talks to the engine: what to send comes from the task's lease
(:mod:`parrot.platform.serve.contexts.leases`), which it settles or discards. The task's
prompt forks from the engine context holding its longest prefix, at the length matched
(wherever it falls); the rest of the prompt and the generation go to the engine as one
streamed ``generate`` request, which also keeps the prompt's shared prefixes (constant
template text) as checkpoint contexts of their own. The generation context then holds
prompt and output; it stays in the tree (a later call that starts with both forks from it)
until its session goes or memory is needed. If the engine fails meanwhile, or a context the
task forked from vanished, the runner says so (:class:`Requeue`) and the scheduler decides
whether the task runs again.
"""

from __future__ import annotations

import time
from contextlib import aclosing

from parrot.engines.protocol.errors import ContextFreedError, EngineUnavailableError, UnknownContextError
from parrot.engines.protocol.schemas import StreamEnd
from parrot.platform.serve.contexts.leases import AheadLease, Lease
from parrot.platform.serve.ops.metrics import ServeMetrics
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.prompt import Prompt, PromptBuilder
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import CompletionTask, Finished

# How often an engine sends the text of an output that nobody reads along with: its value
# is all the ServeCore needs (and the first token's time, sent at once). A per-token event
# costs the engine and the ServeCore CPU on every step, for every stream.
QUIET_STREAM_MS = 100


class Requeue(Exception):
    """The task did not run to its end through no fault of its own: it may run again.
    ``engine_failed``: its engine failed a request (taken out until it answers pings)."""

    def __init__(self, reason: str, engine_failed: bool = False) -> None:
        super().__init__(reason)
        self.engine_failed = engine_failed


class TaskRunner:
    def __init__(
        self, prompts: PromptBuilder, policy: SchedulingPolicy, metrics: ServeMetrics, parent_wait_ms: int
    ) -> None:
        self.prompts = prompts
        self.policy = policy
        self.metrics = metrics
        self.parent_wait_ms = parent_wait_ms  # a fork of a context whose request is in flight waits

    async def prompt(self, task: CompletionTask, slot: EngineSlot) -> Prompt:
        prompt = task.prompts.get(slot.prompt_key)
        if prompt is None:
            fetch = None if slot.text else slot.tokenize
            prompt = await self.prompts.build(task.chain, slot.model, fetch, slot.text)
            task.prompts[slot.prompt_key] = prompt
        return prompt

    async def generate(self, task: CompletionTask, lease: Lease) -> Finished:
        """Run the placed task; its lease is settled or discarded whatever happens. Always
        streamed from the engine: whoever follows the variable sees its text as it is
        written (``GET /v1/semantic_var/{id}/stream``, the OpenAI front), and its first
        token is timed."""
        slot, gen = lease.slot, task.gen
        started, first_token_at, ttft = time.monotonic(), None, None
        stream = gen.var.stream
        args = {
            **lease.request(),
            # Its parent's own request may still be on its way to the engine.
            "parent_timeout_ms": self.parent_wait_ms if lease.parent_pending else 0,
            "priority": self.policy.priority(task),
            "stream_interval_ms": 0 if stream.live else QUIET_STREAM_MS,
        }
        events = slot.client.generate_stream(lease.context.context_id, gen.sampling, lease.parent_id, **args)
        try:
            async with aclosing(events):  # its HTTP stream ends here, not when collected
                async for event in events:
                    if isinstance(event, StreamEnd):
                        break
                    if first_token_at is None:
                        first_token_at, ttft = time.time(), time.monotonic() - started
                    stream.append(event.text, event.tokens)
                else:
                    raise EngineUnavailableError(
                        f"engine {slot.engine_id} ended a stream without its end event"
                    )
        except (ContextFreedError, UnknownContextError) as error:  # a context it forked from went
            lease.discard()
            raise Requeue(str(error)) from None
        except EngineUnavailableError as error:
            lease.discard()
            raise Requeue(str(error), engine_failed=True) from None
        except BaseException:
            lease.discard()
            raise
        lease.settle(event)
        self.metrics.observe_task(time.monotonic() - started, ttft, len(event.token_ids))
        prompt_ids = None if slot.text else tuple(lease.prompt.symbols)
        return Finished(event, first_token_at, slot.model, prompt_ids)

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
