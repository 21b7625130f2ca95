"""The local scheduler: continuous batching of Fill and Generate jobs under a token budget.

Each step takes the running jobs first (oldest first: decodes cost one token, unfinished
fills a chunk), then admits waiting jobs in arrival order while budget, sequence slots and
KV blocks last. When blocks run out, the newest running job is preempted: its context's KV
is released and recomputed when it is resumed (reusing any blocks still cached), so a
context is never left half-written.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from parrot.engines.builtin.batch import StepItem
from parrot.engines.builtin.context import Context, ContextPool
from parrot.engines.builtin.jobs import Job, JobKind


@dataclass(frozen=True)
class SchedulerConfig:
    max_batched_tokens: int = 1024
    max_running: int = 64


class LocalScheduler:
    def __init__(self, config: SchedulerConfig, pool: ContextPool, prepare: Callable[[Job], bool]) -> None:
        self.config = config
        self.pool = pool
        # Materializes the job's context and appends its tokens, once; False when it failed
        # the job (e.g. its parent was freed), which then leaves the queue.
        self.prepare = prepare
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.num_preemptions = 0
        self._admit_counter = 0
        self.step_counter = 0

    def add(self, job: Job) -> None:
        self.waiting.append(job)

    def remove(self, job: Job) -> None:
        if job in self.running:
            self.running.remove(job)
            job.context.busy = False
        elif job in self.waiting:
            self.waiting.remove(job)

    def jobs_of(self, ctx: Context) -> list[Job]:
        return [j for j in (*self.running, *self.waiting) if j.context is ctx]

    def jobs_of_sink(self, sink: object) -> list[Job]:
        return [j for j in (*self.running, *self.waiting) if j.sink is sink]

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------------------------
    def schedule(self) -> list[StepItem]:
        self.step_counter += 1
        budget = self.config.max_batched_tokens
        items: list[StepItem] = []
        for job in list(self.running):
            if job not in self.running:  # preempted while making room for an older job
                continue
            ctx = job.context
            ctx.last_used = self.step_counter
            pending = ctx.num_pending
            if pending == 0:
                if job.kind is JobKind.GENERATE:
                    items.append(StepItem(ctx, ctx.num_computed, 0, sample=True))
                continue
            n = min(pending, budget)
            if n <= 0:
                continue
            if not self._make_room(ctx, ctx.num_computed + n, job):
                continue  # the job itself was preempted
            items.append(
                StepItem(ctx, ctx.num_computed, n, sample=job.kind is JobKind.GENERATE and n == pending)
            )
            budget -= n
        self._admit(items, budget)
        return items

    def _admit(self, items: list[StepItem], budget: int) -> None:
        blocked: set[int] = set()  # contexts with an earlier waiting job: keep per-context order
        for job in list(self.waiting):
            if len(self.running) >= self.config.max_running or budget <= 0:
                return
            ctx = job.context
            parent = ctx.parent
            keys = {id(ctx)} | ({id(parent)} if parent is not None else set())
            if (
                ctx.busy
                or (parent is not None and (parent.busy or not parent.materialized))
                or keys & blocked
            ):
                blocked |= keys
                continue
            if not job.prepared:
                if not self.prepare(job):
                    self.waiting.remove(job)
                    continue
                job.prepared = True
            reused = self.pool.reuse_cached_prefix(ctx)
            if job.admitted_seq < 0:
                job.cached_tokens += reused
            pending = ctx.num_pending
            n = min(pending, budget)
            need = self.pool.blocks_needed(ctx, ctx.num_computed + n)
            if need > self.pool.blocks.num_free:
                if self.running or items:
                    return  # running jobs will free blocks; keep arrival order
                self._evict_idle(need, exclude=ctx)
            if not self.pool.ensure_blocks(ctx, ctx.num_computed + n):
                return
            self.waiting.remove(job)
            ctx.busy = True
            ctx.last_used = self.step_counter
            self._admit_counter += 1
            job.admitted_seq = self._admit_counter
            self.running.append(job)
            if n or job.kind is JobKind.GENERATE:
                items.append(
                    StepItem(ctx, ctx.num_computed, n, sample=job.kind is JobKind.GENERATE and n == pending)
                )
            budget -= n

    def _make_room(self, ctx: Context, num_tokens: int, job: Job) -> bool:
        """Ensure blocks for ``ctx``; preempt newer jobs (or this one) when there are none."""
        while not self.pool.ensure_blocks(ctx, num_tokens):
            victim = max(self.running, key=lambda j: j.admitted_seq)
            # Alone and still out of blocks: idle contexts must give way.
            alone = victim is job and len(self.running) == 1
            if alone and self._evict_idle(self.pool.blocks_needed(ctx, num_tokens), exclude=ctx):
                continue
            self._preempt(victim)
            if victim is job:
                return False
        return True

    def _preempt(self, job: Job) -> None:
        self.running.remove(job)
        job.context.busy = False
        job.preemptions += 1
        self.num_preemptions += 1
        self.pool.release_kv(job.context)
        self.waiting.appendleft(job)

    def _evict_idle(self, need: int, exclude: Context) -> bool:
        """Release the KV of idle contexts, least recently used first, until ``need`` blocks are free."""
        idle = sorted(
            (c for c in self.pool.contexts.values() if not c.busy and c.blocks and c is not exclude),
            key=lambda c: c.last_used,
        )
        for ctx in idle:
            if self.pool.blocks.num_free >= need:
                break
            self.pool.release_kv(ctx)
        return self.pool.blocks.num_free >= need
