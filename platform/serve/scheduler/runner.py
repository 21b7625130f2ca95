"""Running one completion task on an engine: one engine request on the critical path.

The task's prompt forks from the engine context holding its longest prefix, at the length
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from parrot.engines.protocol.errors import ContextFreedError, EngineUnavailableError, UnknownContextError
from parrot.engines.protocol.schemas import GenerateResponse, StreamEnd
from parrot.platform.serve.contexts import READY, EngineContext
from parrot.platform.serve.metrics import ServeMetrics
from parrot.platform.serve.prompt import Prompt, PromptBuilder
from parrot.platform.serve.scheduler.policy import SchedulingPolicy
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import CompletionTask

log = logging.getLogger(__name__)
Result = GenerateResponse | StreamEnd


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
    evicted: int = 0  # cached contexts freed under engine memory pressure


@dataclass(eq=False)
class Placement:
    """A task's contexts on its engine, made when it is placed (so the tasks placed right
    after it see its prompt in the tree)."""

    task: CompletionTask
    slot: EngineSlot
    prompt: Prompt
    context: EngineContext
    parent: EngineContext | None
    length: int  # symbols taken from the parent
    checkpoints: list[EngineContext]


class TaskRunner:
    def __init__(
        self,
        prompts: PromptBuilder,
        policy: SchedulingPolicy,
        stats: SchedulerStats,
        free: Callable[[EngineSlot, list[EngineContext]], None],
        metrics: ServeMetrics,
        parent_wait_ms: int,
    ) -> None:
        self.prompts = prompts
        self.policy = policy
        self.stats = stats
        self.metrics = metrics
        self.parent_wait_ms = parent_wait_ms  # a fork of a context whose request is in flight waits
        self.free = free  # forget contexts and free them on their engine, off the critical path

    async def prompt(self, task: CompletionTask, slot: EngineSlot) -> Prompt:
        prompt = task.prompts.get(slot.prompt_key)
        if prompt is None:
            fetch = None if slot.text else slot.tokenize
            prompt = await self.prompts.build(task.chain, slot.model, fetch, slot.text)
            task.prompts[slot.prompt_key] = prompt
        return prompt

    def place(self, task: CompletionTask, slot: EngineSlot, prompt: Prompt) -> Placement:
        tree, symbols = slot.contexts, prompt.symbols
        point = tree.fork_point(symbols)
        length = min(point.length, len(symbols) - 1)  # at least one token is computed here
        parent = point.parent if length > 0 else None
        marks = [n for n in prompt.shared if n > length and not tree.shares_at(symbols[:n])]
        context = tree.add(symbols, owner=task.session_id)
        checkpoints = [tree.add(symbols[:n], owner=None) for n in marks]
        for held in (parent, context):
            if held is not None:
                held.refs += 1
                tree.touch(held)
        self.stats.prompt_tokens += len(symbols)
        self.stats.reused_tokens += length if parent is not None else 0
        return Placement(task, slot, prompt, context, parent, length if parent else 0, checkpoints)

    async def run(self, placed: Placement) -> Result:
        """Run the placed task; its contexts are settled whatever happens."""
        slot, task = placed.slot, placed.task
        started = time.monotonic()
        first_token: list[float] = []  # when a streamed task's first token came
        try:
            result = await self._until_lost(slot, self._generate(placed, first_token))
        except (ContextFreedError, UnknownContextError) as error:  # a context it forked from went
            self._discard(placed)
            raise Requeue(str(error)) from None
        except EngineUnavailableError as error:
            self._discard(placed)
            if task.streamed:  # its client saw tokens: a rerun would repeat them
                raise
            raise Requeue(str(error), engine_failed=slot.up) from None
        except BaseException:
            self._discard(placed)
            raise
        finally:
            for held in (placed.parent, placed.context):
                if held is not None and slot.contexts.unref(held):
                    self.free(slot, [held])
        self._settle(placed, result)
        self.stats.done += 1
        ttft = first_token[0] - started if first_token else None
        self.metrics.observe_task(time.monotonic() - started, ttft, len(result.token_ids))
        return result

    def _settle(self, placed: Placement, result: Result) -> None:
        slot, ctx = placed.slot, placed.context
        ctx.state = READY
        for mark in placed.checkpoints:
            mark.state = READY
        if not slot.text:
            placed.task.chain.prompt_tokens[slot.model] = list(placed.prompt.symbols)
        if slot.text or not result.stop_string:  # the context holds exactly prompt + output
            slot.contexts.extend(ctx, result.text if slot.text else tuple(result.token_ids))
        else:  # a stop string cut the text: its KV holds more than the value; not reusable
            self.free(slot, [ctx])

    def _discard(self, placed: Placement) -> None:
        """The request failed: its contexts are gone or useless on the engine."""
        self.free(placed.slot, [placed.context, *placed.checkpoints])

    async def _generate(self, placed: Placement, first_token: list[float]) -> Result:
        task, slot = placed.task, placed.slot
        tail = placed.prompt.symbols[placed.length :]
        gen = task.gen
        pending = placed.parent is not None and placed.parent.state != READY
        args = {
            "parent_len": placed.length if placed.parent is not None else None,
            # Its parent's own request may still be on its way to the engine.
            "parent_timeout_ms": self.parent_wait_ms if pending else 0,
            "priority": self.policy.priority(task),
            "checkpoints": [(c.context_id, c.length) for c in placed.checkpoints],
            **({"text": tail} if slot.text else {"token_ids": list(tail)}),
        }
        parent_id = placed.parent.context_id if placed.parent is not None else None
        cid = placed.context.context_id
        if gen.on_token is None:
            return await slot.client.generate(cid, gen.sampling, parent_id, **args)
        async for event in slot.client.generate_stream(cid, gen.sampling, parent_id, **args):
            if isinstance(event, StreamEnd):
                return event
            if not first_token:
                first_token.append(time.monotonic())
            if event.text:
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
