"""The local scheduler: continuous batching of Fill and Generate jobs under a token budget.

Jobs come in three levels: latency-critical (priority > 0), normal, and background (fills
that only prepare for later). Each step is built level by level, running jobs before
waiting ones within a level (decodes cost one token, unfinished fills a chunk), while
budget, sequence slots and KV blocks last:

- latency-critical jobs always get the step's full limits;
- while any runs, the other levels only fill the step up to ``latency_max_batch`` sequences,
  with at most ``latency_max_prefill_tokens`` of their prompts' tokens: their decodes (one
  token each, cheap in a batch) go on, their prefill (the costly part of a step) waits, so
  the latency-critical tokens come quickly;
- a background fill takes at most ``background_max_batched_tokens`` of a step others use
  (a few prefill tokens ride along a memory-bound decode step almost for free), all of it
  when nothing else runs.

A prompt whose last chunk would be a small tail (at most 1/32 of the step budget) takes it
in the chunk before, past the budget: a step for a few tokens delays the sequence (and
whatever forks its checkpoints: users behind a system prompt just over the budget) by a
whole step.

When blocks run out, the lowest-level, newest running job is preempted: its context's KV is
released and recomputed when it is resumed (reusing any blocks still cached), so a context
is never left half-written.

The scheduler only decides: admitting a job makes its context and appends the job's tokens
(through the context pool); a job that cannot start (its parent was freed) leaves the queue
into ``rejected``, which the engine core fails after the step is scheduled.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from parrot.engines.builtin.batch import StepItem
from parrot.engines.builtin.context_pool import Context, ContextPool, within_fork
from parrot.engines.builtin.jobs import Job, JobKind
from parrot.engines.protocol.errors import ParrotError

URGENT, NORMAL, BACKGROUND = 0, 1, 2  # job levels, first served first


TAIL_SLACK = 32  # a prompt's last chunk of at most budget / 32 tokens joins the one before


@dataclass(frozen=True)
class SchedulerConfig:
    max_batched_tokens: int = 1024
    max_running: int = 64
    # While a latency-critical job runs, other jobs fill its steps up to these (None: no cap):
    # sequences in the step, and tokens of their prompts (prefill). No cap by default: on
    # a CPU a small step costs its weight passes whatever it holds, so a cap of 32 prompt
    # tokens made the mixed benchmark's one engine do 1.3x the work (2,624-token chats
    # beside map-reduce: map-reduce 0.57x the baseline's, chat time per token 0.78x; with no
    # cap both ~1.0x). With two engines or more the ServeCore keeps the two kinds of work
    # apart instead (platform/serve/scheduler/policy.py, EngineRoles).
    latency_max_batch: int | None = None
    latency_max_prefill_tokens: int | None = None
    # A background fill's tokens in a step that other jobs use.
    background_max_batched_tokens: int = 32

    def __post_init__(self) -> None:
        names = (
            "max_batched_tokens",
            "max_running",
            "latency_max_batch",
            "latency_max_prefill_tokens",
            "background_max_batched_tokens",
        )
        for name in names:
            value = getattr(self, name)
            if value is not None and value < (0 if name == "latency_max_prefill_tokens" else 1):
                raise ValueError(f"{name} must be positive, got {value}")


def level(job: Job) -> int:
    if job.priority > 0:
        return URGENT
    return BACKGROUND if job.background else NORMAL


def _order(job: Job) -> tuple[int, int, int]:
    return (level(job), -job.priority, job.seq)


class LocalScheduler:
    def __init__(self, config: SchedulerConfig, pool: ContextPool) -> None:
        self.config = config
        self.pool = pool
        # Jobs that left the queue because they cannot start, with why: the engine core
        # fails them (``take_rejected``) after each ``schedule``.
        self.rejected: list[tuple[Job, ParrotError]] = []
        self.waiting: list[Job] = []  # by level, priority, then submission order
        self.running: list[Job] = []
        self.num_preemptions = 0
        self._admit_counter = 0
        self._prefill_left: int | None = None  # prompt tokens the step may still take (None: any)
        # id(context) -> its length once the step being built is computed (forks share it)
        self._writing: dict[int, int] = {}
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

    def take_rejected(self) -> list[tuple[Job, ParrotError]]:
        rejected, self.rejected = self.rejected, []
        return rejected

    # ------------------------------------------------------------------------------------
    def schedule(self) -> list[StepItem]:
        """The step, level by level (see the module's docstring)."""
        self.step_counter += 1
        cfg = self.config
        urgent = any(level(j) == URGENT for j in (*self.running, *self.waiting))
        items: list[StepItem] = []
        budget = cfg.max_batched_tokens
        self._prefill_left = None
        self._writing = {}
        for lvl in (URGENT, NORMAL, BACKGROUND):
            max_seqs, allowance = cfg.max_running, budget
            if urgent and lvl == NORMAL:  # beside latency-critical work the step stays small
                max_seqs = cfg.latency_max_batch or max_seqs
                self._prefill_left = cfg.latency_max_prefill_tokens
            if lvl == BACKGROUND and items:
                allowance = min(allowance, cfg.background_max_batched_tokens)
            left = self._continue(items, allowance, max_seqs, lvl)
            left = self._admit(items, left, max_seqs, lvl)
            budget -= allowance - left
        return items

    def _take(self, job: Job, pending: int, budget: int) -> int:
        """Tokens of ``job`` to compute now: within the budget and, for a prompt (not a
        decode's one token) beside latency-critical work, within the prefill allowance."""
        n = min(pending, budget)
        decode = job.kind is JobKind.GENERATE and pending == 1
        tail = pending - n
        if n > 0 and self._prefill_left is None and 0 < tail <= self.config.max_batched_tokens // TAIL_SLACK:
            return pending  # no step of its own for a small tail
        return n if self._prefill_left is None or decode else min(n, self._prefill_left)

    def _spend(self, job: Job, pending: int, n: int, budget: int) -> int:
        """``n`` tokens of ``job`` are in the step: the budget left (and the allowance)."""
        if self._prefill_left is not None and not (job.kind is JobKind.GENERATE and pending == 1):
            self._prefill_left -= n
        return budget - n

    def _continue(self, items: list[StepItem], budget: int, max_seqs: int, lvl: int) -> int:
        """Steps of running jobs of one level (oldest first); returns the budget left."""
        for job in sorted((j for j in self.running if level(j) == lvl), key=lambda j: j.admitted_seq):
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
            n = self._take(job, pending, budget)
            if n <= 0:
                continue
            if not self._make_room(ctx, ctx.num_computed + n, job):
                continue  # the job itself was preempted
            self._put(items, job, pending, n)
            budget = self._spend(job, pending, n, budget)
        return budget

    def _put(self, items: list[StepItem], job: Job, pending: int, n: int) -> None:
        """``n`` of the job's ``pending`` tokens in the step (it samples once they are all)."""
        ctx = job.context
        items.append(StepItem(ctx, ctx.num_computed, n, sample=job.kind is JobKind.GENERATE and n == pending))
        if n:
            self._writing[id(ctx)] = ctx.num_computed + n

    def _can_fork(self, ctx: Context, first_waiting: dict[int, int], job: Job) -> bool:
        """A new context may fork its parent once the tokens it takes are computed, or are
        written in the step being built (it reads them in that step: ContextPool._fork), or
        the parent has nothing left to do before this job (then it forks what there is). A
        checkpoint not made yet is its prompt's first tokens."""
        parent = ctx.parent
        if parent is None:
            return ctx.parent_id is None or ctx.materialized  # else: its parent is not there yet
        if not parent.materialized:  # its first tokens are its own parent's, up to its fork
            prompt, need = parent.parent, ctx.parent_len
            return within_fork(ctx, parent) and self._writing.get(id(prompt), 0) >= need
        idle = not parent.busy and first_waiting.get(id(parent), job.seq) >= job.seq
        if ctx.parent_len is None:
            return idle
        return idle or ctx.parent_len <= max(parent.num_computed, self._writing.get(id(parent), 0))

    def _admit(self, items: list[StepItem], budget: int, max_seqs: int, lvl: int) -> int:
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
            if level(job) != lvl:
                continue
            if len(self.running) >= self.config.max_running or len(items) >= max_seqs or budget <= 0:
                return budget
            ctx = job.context
            if ctx.busy or first_waiting[id(ctx)] < job.seq or not self._can_fork(ctx, first_waiting, job):
                continue  # jobs of one context run in submission order
            if not job.prepared:  # its first admission: make the context, append the tokens
                try:
                    self.pool.admit(ctx, job.fill_tokens, self._writing)
                except ParrotError as error:  # e.g. its parent was freed
                    self.waiting.remove(job)
                    self.rejected.append((job, error))
                    continue
                job.prepared = True
                job.prompt_tokens = len(ctx.token_ids)
            if job.kind is JobKind.GENERATE and not self.pool.ensure_last_pending(ctx):
                return budget  # out of blocks: running jobs will free some
            reused = self.pool.reuse_cached_prefix(ctx)
            if job.admitted_seq < 0:
                job.cached_tokens += reused
            pending = ctx.num_pending
            n = self._take(job, pending, budget)
            if n <= 0 and pending:
                return budget  # its prompt must wait for a step without latency-critical work
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
                self._put(items, job, pending, n)
            budget = self._spend(job, pending, n, budget)
        return budget

    def _make_room(self, ctx: Context, num_tokens: int, job: Job) -> bool:
        """Ensure blocks for ``ctx``; preempt newer jobs (or this one) when there are none."""
        while not self.pool.ensure_blocks(ctx, num_tokens):
            victim = max(self.running, key=lambda j: (level(j), -j.priority, j.admitted_seq))
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
