"""The local scheduler: continuous batching of Fill and Generate jobs under a token budget.

Each step takes the running jobs first (the highest priority first, then the oldest:
decodes cost one token, unfinished fills a chunk), then admits waiting jobs by priority and
arrival while budget, sequence slots and KV blocks last. While a latency-critical job
(priority > 0) runs, the step is kept small (``latency_max_batch`` sequences,
``latency_max_batched_tokens`` tokens) so its tokens come quickly. When blocks run out, the
lowest-priority, newest running job is preempted: its context's KV is released and
recomputed when it is resumed (reusing any blocks still cached), so a context is never left
half-written.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from parrot.engines.builtin.batch import StepItem
from parrot.engines.builtin.context import Context, ContextPool
from parrot.engines.builtin.jobs import Job, JobKind


@dataclass(frozen=True)
class SchedulerConfig:
    max_batched_tokens: int = 1024
    max_running: int = 64
    # While a job of priority > 0 runs: at most this many sequences and tokens per step
    # (None: no cap). Small steps keep latency-critical decoding fast beside bulk work.
    latency_max_batch: int | None = None
    latency_max_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_batched_tokens", "max_running", "latency_max_batch", "latency_max_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")


def _order(job: Job) -> tuple[int, int]:
    return (-job.priority, job.seq)


class LocalScheduler:
    def __init__(self, config: SchedulerConfig, pool: ContextPool, prepare: Callable[[Job], bool]) -> None:
        self.config = config
        self.pool = pool
        # Materializes the job's context and appends its tokens, once; False when it failed
        # the job (e.g. its parent was freed), which then leaves the queue.
        self.prepare = prepare
        self.waiting: list[Job] = []  # by (-priority, submission order)
        self.running: list[Job] = []
        self.num_preemptions = 0
        self._admit_counter = 0
        self.step_counter = 0

    def add(self, job: Job) -> None:
        bisect.insort(self.waiting, job, key=_order)

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

    def _limits(self) -> tuple[int, int]:
        """(sequences, tokens) a step may hold now."""
        cfg = self.config
        urgent = any(j.priority > 0 for j in self.running) or any(j.priority > 0 for j in self.waiting[:1])
        seqs, tokens = cfg.max_running, cfg.max_batched_tokens
        if urgent:
            seqs = min(seqs, cfg.latency_max_batch or seqs)
            tokens = min(tokens, cfg.latency_max_batched_tokens or tokens)
        return seqs, tokens

    # ------------------------------------------------------------------------------------
    def schedule(self) -> list[StepItem]:
        """The step: latency-critical jobs first (running, then waiting ones admitted), then
        the rest, within the step's sequence and token limits."""
        self.step_counter += 1
        max_seqs, budget = self._limits()
        items: list[StepItem] = []
        for urgent in (True, False):
            budget = self._continue(items, budget, max_seqs, urgent)
            budget = self._admit(items, budget, max_seqs, urgent)
        return items

    def _continue(self, items: list[StepItem], budget: int, max_seqs: int, urgent: bool) -> int:
        """Steps of running jobs of one level (oldest first); returns the budget left."""
        level = [j for j in self.running if (j.priority > 0) == urgent]
        for job in sorted(level, key=lambda j: (-j.priority, j.admitted_seq)):
            if job not in self.running:  # preempted while making room for an older job
                continue
            if len(items) >= max_seqs:
                break  # the others keep their KV and wait for a step of their own
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
        return budget

    def _can_fork(self, ctx: Context, first_waiting: dict[int, int], job: Job) -> bool:
        """A new context may fork its parent once the tokens it takes are computed, or the
        parent has nothing left to do before this job (then it forks what there is)."""
        parent = ctx.parent
        if parent is None:
            return ctx.parent_id is None or ctx.materialized  # else: its parent is not there yet
        if not parent.materialized:
            return False
        idle = not parent.busy and first_waiting.get(id(parent), job.seq) >= job.seq
        if ctx.parent_len is None:
            return idle
        return idle or parent.num_computed >= ctx.parent_len

    def _admit(self, items: list[StepItem], budget: int, max_seqs: int, urgent: bool) -> int:
        """Admit waiting jobs of one level in order; returns the budget left."""
        # Context -> submission order of its first waiting job. A fork of a whole parent
        # counts as a job of the parent too: it takes the parent as it is after the jobs
        # submitted before it, so the parent's later jobs wait until the fork is made.
        first_waiting: dict[int, int] = {}
        for job in self.waiting:
            keys = [id(job.context)]
            parent = job.context.parent
            if parent is not None and job.context.parent_len is None:
                keys.append(id(parent))
            for key in keys:
                first_waiting[key] = min(job.seq, first_waiting.get(key, job.seq))
        for job in list(self.waiting):
            if (job.priority > 0) != urgent:
                continue
            if len(self.running) >= self.config.max_running or len(items) >= max_seqs or budget <= 0:
                return budget
            ctx = job.context
            if ctx.busy or first_waiting[id(ctx)] < job.seq or not self._can_fork(ctx, first_waiting, job):
                continue  # jobs of one context run in submission order
            if not job.prepared:
                if not self.prepare(job):
                    self.waiting.remove(job)
                    continue
                job.prepared = True
            if job.kind is JobKind.GENERATE and not self.pool.ensure_last_pending(ctx):
                return budget  # out of blocks: running jobs will free some
            reused = self.pool.reuse_cached_prefix(ctx)
            if job.admitted_seq < 0:
                job.cached_tokens += reused
            pending = ctx.num_pending
            n = min(pending, budget)
            need = self.pool.blocks_needed(ctx, ctx.num_computed + n)
            if need > self.pool.blocks.num_free:
                if self.running or items:
                    return budget  # running jobs will free blocks; keep the order
                self._evict_idle(need, exclude=ctx)
            if not self.pool.ensure_blocks(ctx, ctx.num_computed + n):
                return budget
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
        return budget

    def _make_room(self, ctx: Context, num_tokens: int, job: Job) -> bool:
        """Ensure blocks for ``ctx``; preempt newer jobs (or this one) when there are none."""
        while not self.pool.ensure_blocks(ctx, num_tokens):
            victim = max(self.running, key=lambda j: (-j.priority, j.admitted_seq))
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
        self.add(job)  # back in its place: by priority, then submission order

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
