"""The engine core: all state of one engine, owned and mutated by the engine thread only.

Requests arrive as commands (``submit_fill``, ``submit_generate``, ``free_context``) and
are validated here, against the contexts as they are; then ``step`` runs one batched model
iteration: schedule (the local scheduler) -> run (the model runner, which changes nothing)
-> mask (the constrained rows' logits, constraints.py) -> sample -> postprocess (the one
place that advances the sequences and hands results back through each job's sink).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from parrot.engines.builtin.block_manager import IntegrityError
from parrot.engines.builtin.constraints import ConstraintMasker
from parrot.engines.builtin.context_pool import Context, ContextPool, Target
from parrot.engines.builtin.jobs import Final, Job, JobKind, JobSink, Outbox
from parrot.engines.builtin.local_scheduler import LocalScheduler, SchedulerConfig
from parrot.engines.builtin.model_runner import ModelRunner
from parrot.engines.builtin.postprocess import Postprocessor
from parrot.engines.builtin.sampler import Sampler
from parrot.engines.builtin.token_rate import TokenRate
from parrot.engines.builtin.tokenizer import Tokenizer
from parrot.engines.protocol.errors import (
    AbortedError,
    BadRequestError,
    CapacityError,
    ContextFreedError,
    InvalidTokenError,
    ParrotError,
    PromptTooLongError,
    UnknownContextError,
)
from parrot.wire.sampling import SamplingParams

log = logging.getLogger(__name__)

_RATE_WINDOW_S = 10.0


class EngineCore:
    def __init__(
        self,
        runner: ModelRunner,
        scheduler_config: SchedulerConfig,
        tokenizer: Tokenizer,
        vocab_size: int,
        max_model_len: int,
        eos_token_ids: frozenset[int],
        outbox: Outbox,
        jump_forward: bool = True,
    ) -> None:
        self.runner = runner
        self.outbox = outbox  # the one way answers leave the engine thread
        self.pool: ContextPool = runner.pool
        self.scheduler = LocalScheduler(scheduler_config, self.pool)
        self.post = Postprocessor(
            self.pool,
            self.scheduler,
            tokenizer,
            eos_token_ids,
            max_model_len,
            runner.device,
            outbox,
            jump_forward,
        )
        self.sampler = Sampler()
        self.constraints = ConstraintMasker(eos_token_ids)
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.capacity_tokens = self.pool.blocks.num_blocks * self.pool.block_size
        self.eos_token_ids = eos_token_ids
        self._seq = 0
        # Statistics (engine thread writes, ``snapshot`` reads).
        self.steps = 0
        self.batched_seqs = 0
        self.max_batch_size = 0
        self.last_batch_size = 0
        self.tokens_computed = 0
        self.tokens_generated = 0
        self.shared_prefix_steps = 0  # steps that took the shared-prefix attention path
        self.graph_steps = 0  # decode steps replayed as CUDA graphs
        self.fused_steps = 0  # decode steps run by the fused CPU step
        self.fill_steps = 0  # steps that only computed prompts (no token sampled)
        self.step_seconds = 0.0  # wall time spent in steps (model, sampling, postprocessing)
        self.rate = TokenRate(_RATE_WINDOW_S)

    # -- commands ------------------------------------------------------------------------
    def submit_fill(
        self,
        target: Target,
        token_ids: Sequence[int],
        sink: JobSink,
        priority: int = 0,
        checkpoints: Sequence[tuple[int, int]] = (),
        background: bool = False,
    ) -> None:
        if not token_ids:
            raise BadRequestError("fill needs at least one token (token_ids or text was empty)")
        self._check_tokens(token_ids)
        created = target.context_id not in self.pool.contexts
        ctx = self.pool.context_for(target)
        self._check_length(ctx, len(token_ids), what="fill")
        job = Job(
            JobKind.FILL,
            ctx,
            sink,
            self._next_seq(),
            fill_tokens=list(token_ids),
            priority=priority,
            background=background,
        )
        self._plan(job, created, checkpoints, self.pool.planned(ctx) + len(token_ids), len(token_ids))
        self.scheduler.add(job)

    def submit_generate(
        self,
        target: Target,
        sampling: SamplingParams,
        sink: JobSink,
        tail_token_ids: Sequence[int] = (),
        priority: int = 0,
        checkpoints: Sequence[tuple[int, int]] = (),
        grammar: object = None,
    ) -> None:
        """Generate into the context, after filling ``tail_token_ids`` (the prompt's tail) in
        the same job; ``grammar``: the compiled output format (see grammars.py), if any."""
        new_root = target.parent_id is None and target.context_id not in self.pool.contexts
        if new_root and not tail_token_ids:
            raise UnknownContextError(
                f"context {target.context_id} does not exist: fill it first, "
                "or pass parent_context_id to fork"
            )
        self._check_tokens(tail_token_ids)
        created = target.context_id not in self.pool.contexts
        ctx = self.pool.context_for(target)
        prompt_len = self.pool.planned(ctx) + len(tail_token_ids)
        if prompt_len == 0:
            self._drop_if_empty(ctx)
            raise BadRequestError(
                f"context {target.context_id} is empty: fill it (or fork a filled parent) before generating"
            )
        self._check_length(ctx, len(tail_token_ids) + sampling.max_tokens, what="generate")
        job = Job(
            JobKind.GENERATE,
            ctx,
            sink,
            self._next_seq(),
            fill_tokens=list(tail_token_ids),
            sampling=sampling,
            priority=priority,
            grammar=grammar,
        )
        self._plan(job, created, checkpoints, prompt_len, len(tail_token_ids) + sampling.max_tokens)
        self.scheduler.add(job)  # it waits there for a step

    def free_context(self, context_id: int) -> int:
        ctx = self.pool.contexts.get(context_id)
        if ctx is None:
            return 0  # freeing twice (or never created) is harmless
        return self._free(
            ctx, lambda: ContextFreedError(f"context {context_id} was freed while a job was running on it")
        )

    def abort(self, context_ids: Sequence[int]) -> tuple[int, int]:
        """Stop every job on these contexts (their callers get :class:`AbortedError`) and free
        the contexts. Returns (jobs aborted, contexts freed); unknown ids are skipped."""
        jobs = freed = 0
        for context_id in context_ids:
            ctx = self.pool.contexts.get(context_id)
            if ctx is None:
                continue
            jobs += len(self.scheduler.jobs_of(ctx))
            self._free(ctx, lambda cid=context_id: AbortedError(f"the job on context {cid} was aborted"))
            freed += 1
        return jobs, freed

    def abort_range(self, start: int, end: int) -> tuple[int, int]:
        """:meth:`abort` for every context with ``start <= id < end`` (the contexts a
        ServeCore that died left here: each run of a ServeCore takes its ids from a range)."""
        return self.abort([cid for cid in self.pool.contexts if start <= cid < end])

    def cancel(self, sink: JobSink) -> None:
        """Drop the jobs whose caller went away (a closed stream, a dropped connection). The
        contexts their requests created (the job's new context, its checkpoints) are freed:
        nobody knows them; contexts that existed before stay valid."""
        for job in self.scheduler.jobs_of_sink(sink):
            self.post.retire(job)
            self._drop_checkpoints(job)
            for ctx in job.created:
                if not ctx.freed:
                    self._fail_forks_of(ctx)
                    message = f"context {ctx.context_id} was freed: the request that created it went away"
                    self._free(ctx, lambda m=message: ContextFreedError(m))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _check_tokens(self, token_ids: Sequence[int]) -> None:
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidTokenError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")

    def _adopt_orphans(self) -> None:
        """Link waiting forks to parents that arrived; fail those whose parent never did."""
        for ctx, error in self.pool.adopt_orphans():
            self._free(ctx, lambda e=error: e)

    def _checkpoints(self, ctx: Context, wanted: Sequence[tuple[int, int]], prompt_len: int) -> list[Context]:
        """New, not yet made contexts that fork ``ctx`` once its prompt is computed."""
        try:
            return self.pool.add_checkpoints(ctx, wanted, prompt_len)
        except ParrotError:
            self._drop_if_empty(ctx)
            raise

    def _drop_checkpoints(self, job: Job) -> None:
        """Checkpoints of a job that will never compute its prompt are never made."""
        for cp in job.checkpoints:
            if not cp.freed and not cp.materialized:
                self._fail_forks_of(cp)
                message = f"checkpoint context {cp.context_id} was never made"
                self._free(cp, lambda m=message: ContextFreedError(m))
        job.checkpoints = []

    def _fail_forks_of(self, ctx: Context) -> None:
        for job in [*self.scheduler.waiting]:
            if job.context.parent is ctx and not job.context.materialized:
                self._drop(job, ContextFreedError(f"context {ctx.context_id} to fork from was never made"))

    def _free(self, ctx: Context, error: Callable[[], ParrotError]) -> int:
        """Free the context; its jobs fail with ``error()`` (nothing may run on a freed context)."""
        for job in self.scheduler.jobs_of(ctx):
            self._drop(job, error())
        return self.pool.free(ctx)

    def _drop(self, job: Job, error: ParrotError) -> None:
        self.scheduler.remove(job)
        self._drop_checkpoints(job)
        self.outbox.post([(job.sink, Final(error=error))])

    def _reject(self, job: Job, error: ParrotError) -> None:
        """A job that could not start (its context cannot be made): it fails, and so do the
        other jobs on that context; the context, never made, goes."""
        self._drop_checkpoints(job)
        self.outbox.post([(job.sink, Final(error=error))])
        for other in self.scheduler.jobs_of(job.context):
            self._drop(other, error)
        self.pool.discard(job.context)

    def _check_length(self, ctx: Context, extra: int, what: str) -> None:
        planned = self.pool.planned(ctx)
        total = planned + extra
        if total > self.max_model_len:
            self._drop_if_empty(ctx)
            raise PromptTooLongError(
                f"{what} would make context {ctx.context_id} {total} tokens long "
                f"(current {planned} + {extra}), over the model's context length of "
                f"{self.max_model_len}"
            )
        if total > self.capacity_tokens:
            self._drop_if_empty(ctx)
            raise CapacityError(
                f"{what} needs KV for {total} tokens, more than the whole cache holds "
                f"({self.capacity_tokens} tokens); start the engine with more KV cache memory"
            )

    def _drop_if_empty(self, ctx: Context) -> None:
        """A context created by a rejected request must not linger."""
        if not ctx.materialized and not self.scheduler.jobs_of(ctx):
            self.pool.discard(ctx)

    def _plan(
        self, job: Job, created: bool, checkpoints: Sequence[tuple[int, int]], prompt_len: int, extra: int
    ) -> None:
        """Plan a job whose context (``created``: made by this request) will hold
        ``prompt_len`` tokens once its prompt is computed, and ``extra`` more than now at most
        (its checkpoints, which it forks then, are made with it)."""
        ctx = job.context
        job.checkpoints = self._checkpoints(ctx, checkpoints, prompt_len)
        job.created = [ctx, *job.checkpoints] if created else list(job.checkpoints)
        self.pool.plan(ctx, extra)

    # -- the step ------------------------------------------------------------------------
    def step(self) -> bool:
        """One batched iteration: schedule, run, sample, postprocess; False when there was
        nothing to do."""
        if self.pool.orphans:
            self._adopt_orphans()
        items = self.scheduler.schedule()
        for job, error in self.scheduler.take_rejected():
            self._reject(job, error)
        if not items:
            return False
        jobs = {id(job.context): job for job in self.scheduler.running}
        started = time.perf_counter()
        output = self.runner.run(items)
        sampled = [jobs[id(item.context)] for item in items if item.sample]
        tokens = []
        if sampled:
            seqs = [self.post.sampling(job) for job in sampled]
            logits = self.constraints.apply(output.logits, [job.state.constraint for job in sampled])
            tokens = self.sampler.sample(logits, seqs)
        self.post.postprocess(items, jobs, output, sampled, tokens)
        computed = sum(item.num_tokens for item in items)
        self._record(len(items), computed, len(tokens), output.shared_prefix, output.path)
        self.step_seconds += time.perf_counter() - started
        if log.isEnabledFor(logging.DEBUG):  # a step trace, for profiling a workload
            log.debug(
                "step %d: %d items, %d tokens (%d prefill items), %d sampled, %s, %.1f ms",
                self.steps, len(items), computed, sum(item.num_tokens > 1 for item in items),
                len(tokens), output.path, 1000 * (time.perf_counter() - started),
            )  # fmt: skip
        return True

    def fail_all(self, error: ParrotError) -> None:
        for job in [*self.scheduler.running, *self.scheduler.waiting]:
            self._drop(job, error)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def check_integrity(self) -> None:
        """Raise :class:`IntegrityError` when the engine's bookkeeping contradicts itself:
        the pool's and the block manager's (see :meth:`ContextPool.check_integrity`), and
        the jobs': each runs on a context of the pool, one running job per busy context."""
        self.pool.check_integrity()
        problems = []
        running = {id(job.context) for job in self.scheduler.running}
        if len(running) != len(self.scheduler.running):
            problems.append("two running jobs share a context")
        for job in [*self.scheduler.running, *self.scheduler.waiting]:
            ctx = job.context
            if self.pool.contexts.get(ctx.context_id) is not ctx:
                state = "freed" if ctx.freed else "not in the pool"
                problems.append(
                    f"a {job.kind.value} job is queued on context {ctx.context_id}, which is {state}"
                )
            elif not self.pool.is_planned(ctx):
                problems.append(f"context {ctx.context_id} has a queued job but no planned length")
        for ctx in self.pool.contexts.values():
            if ctx.busy != (id(ctx) in running):
                problems.append(
                    f"context {ctx.context_id}: busy is {ctx.busy}, running job {id(ctx) in running}"
                )
            if ctx.parent is not None and ctx.parent.freed and not self.scheduler.jobs_of(ctx):
                problems.append(f"context {ctx.context_id} waits to fork freed context {ctx.parent_id}")
        if problems:
            raise IntegrityError("engine jobs are inconsistent: " + "; ".join(problems[:20]))

    # -- statistics ----------------------------------------------------------------------
    def _record(self, batch_size: int, computed: int, generated: int, shared_prefix: bool, path: str) -> None:
        self.steps += 1
        self.shared_prefix_steps += shared_prefix
        self.graph_steps += path == "graph"
        self.fused_steps += path == "fused"
        self.fill_steps += generated == 0
        self.batched_seqs += batch_size
        self.last_batch_size = batch_size
        self.max_batch_size = max(self.max_batch_size, batch_size)
        self.tokens_computed += computed
        self.tokens_generated += generated
        self.rate.add(time.monotonic(), generated)

    def snapshot(self) -> dict:
        blocks = self.pool.blocks
        rate = self.rate.per_s(time.monotonic())
        contexts = self.pool.contexts.values()
        return {
            "block_size": self.pool.block_size,
            "kv_blocks_total": blocks.num_blocks,
            "kv_blocks_used": blocks.num_used,
            "kv_blocks_shared": blocks.num_shared,
            "kv_blocks_cached_free": blocks.num_cached,
            "kv_blocks_free": blocks.num_free,
            "num_contexts": len(self.pool.contexts),
            "cached_tokens": sum(c.num_computed for c in contexts),
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "tokens_per_s": round(rate, 2),
            "steps": self.steps,
            "mean_batch_size": round(self.batched_seqs / self.steps, 3) if self.steps else 0.0,
            "max_batch_size": self.max_batch_size,
            "tokens_computed": self.tokens_computed,
            "tokens_generated": self.tokens_generated,
            "tokens_forced": self.post.tokens_forced,  # by jump-forward: generated, never sampled
            "shared_prefix_steps": self.shared_prefix_steps,
            "graph_steps": self.graph_steps,
            "fused_steps": self.fused_steps,
            "fill_steps": self.fill_steps,
            "step_seconds": round(self.step_seconds, 6),
            "preemptions": self.scheduler.num_preemptions,
            "max_model_len": self.max_model_len,
            "max_running": self.scheduler.config.max_running,
            "max_batched_tokens": self.scheduler.config.max_batched_tokens,
            "device": str(self.runner.device),
        }
