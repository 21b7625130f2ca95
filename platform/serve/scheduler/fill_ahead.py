"""Filling a waiting chain's known prompt prefix ahead, so only the rest is computed once its
inputs are ready.

A chain whose first input has no value yet still knows the text before it (constant template
text, inputs that have values): that prefix is filled on the engine the chain will likely
run on, and its context is held for the chain (:class:`~parrot.platform.serve.contexts.leases.AheadLease`)
until it runs. An optimization only: whatever fails here, the chain fills its prompt when it
runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.calls.graph import CompletionChain
from parrot.platform.serve.contexts.manager import ContextManager
from parrot.platform.serve.scheduler.prompt import PromptBuilder
from parrot.platform.serve.scheduler.runner import TaskRunner
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.serve.scheduler.task import SchedulerStats

log = logging.getLogger(__name__)
FILL_AHEAD_MIN = 16  # tokens: shorter known prefixes are not worth a call of their own
# Beside a producer about to run, the fill rides in the producer's steps (mixed, so eager:
# on a GPU no CUDA graph; on the tiny proxy the 200-token role prompts of 4 agent apps cost
# 3-6 steps of 48): only a longer prefix, whose prefill it takes off the chain's critical
# path, is worth that.
FILL_BESIDE_MIN = 256


class FillAhead:
    def __init__(
        self, prompts: PromptBuilder, contexts: ContextManager, runner: TaskRunner, stats: SchedulerStats
    ) -> None:
        self.prompts = prompts
        self.contexts = contexts
        self.runner = runner
        self.stats = stats

    async def fill(
        self,
        chain: CompletionChain,
        session_id: str,
        candidates: Sequence[EngineSlot],
        latency: bool,
        beside_producer: bool = False,
    ) -> None:
        """Fill ``chain``'s known prefix on the least loaded of ``candidates`` (engines up);
        ``beside_producer``: only a long one (its input's producer is about to run)."""
        if not candidates:
            return
        slot = min(candidates, key=lambda s: s.load)
        fetch = None if slot.text else slot.tokenize
        try:
            prompt = await self.prompts.known_prefix(chain, slot.model, fetch, slot.text)
        except ParrotError:
            return
        least = FILL_BESIDE_MIN if beside_producer else FILL_AHEAD_MIN
        if prompt is None or len(prompt) < least or chain.settled or not slot.up:
            return
        lease = self.contexts.hold(chain.key, session_id, slot, prompt, least)
        if lease is None:
            return
        try:
            await self.runner.fill(lease, latency)
        except ParrotError as error:
            log.info("fill-ahead of %s failed (%s); the call fills it when it runs", chain.key, error)
            lease.discard()
            return
        except BaseException:
            lease.discard()
            raise
        lease.settle()
        self.stats.filled_ahead += len(lease.tail)
