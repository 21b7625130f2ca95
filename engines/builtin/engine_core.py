"""The engine core: all state of one engine, owned and mutated by the engine thread only.

Requests arrive as commands (``submit_fill``, ``submit_generate``, ``free_context``) and
are validated here, against the contexts as they are; then ``step`` runs one batched model
iteration and hands results back through each job's sink.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.jobs import (
    FillResult,
    GenerateResult,
    Job,
    JobKind,
    JobSink,
    Target,
    TokenEvent,
)
from parrot.engines.builtin.local_scheduler import LocalScheduler
from parrot.engines.builtin.model_runner import ModelRunner
from parrot.engines.builtin.sampler import Sampler, SequenceSampling, StopChecker
from parrot.engines.builtin.tokenizer import IncrementalDetokenizer, Tokenizer
from parrot.engines.protocol.errors import (
    AbortedError,
    BadRequestError,
    CapacityError,
    ContextConflictError,
    ContextFreedError,
    InvalidTokenError,
    ParrotError,
    PromptTooLongError,
    UnknownContextError,
)
from parrot.engines.protocol.sampling import SamplingParams

log = logging.getLogger(__name__)

_RATE_WINDOW_S = 10.0


@dataclass(eq=False)
class GenerationState:
    sampling: SequenceSampling
    detokenizer: IncrementalDetokenizer
    stop: StopChecker | None
    text: str = ""
    emitted: int = 0  # characters of ``text`` already streamed


class EngineCore:
    def __init__(
        self,
        runner: ModelRunner,
        scheduler_factory,
        tokenizer: Tokenizer,
        vocab_size: int,
        max_model_len: int,
        eos_token_ids: frozenset[int],
    ) -> None:
        self.runner = runner
        self.pool: ContextPool = runner.pool
        self.scheduler: LocalScheduler = scheduler_factory(self.pool, self._prepare)
        self.tokenizer = tokenizer
        self.sampler = Sampler()
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.capacity_tokens = self.pool.blocks.num_blocks * self.pool.block_size
        self.eos_token_ids = eos_token_ids
        self._seq = 0
        self._planned_len: dict[int, int] = {}  # context id -> length once its queued jobs ran
        self._orphans: dict[int, Context] = {}  # forks waiting for a parent not there yet
        # Statistics (engine thread writes, ``snapshot`` reads).
        self.steps = 0
        self.batched_seqs = 0
        self.max_batch_size = 0
        self.last_batch_size = 0
        self.tokens_computed = 0
        self.tokens_generated = 0
        self._recent: deque[tuple[float, int]] = deque()

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
        ctx = self._context_for(target)
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
        job.checkpoints = self._checkpoints(ctx, checkpoints, self._planned(ctx) + len(token_ids))
        job.created = [ctx, *job.checkpoints] if created else list(job.checkpoints)
        self._enqueue(job, len(token_ids))

    def submit_generate(
        self,
        target: Target,
        sampling: SamplingParams,
        sink: JobSink,
        prompt_tokens: Sequence[int] = (),
        priority: int = 0,
        checkpoints: Sequence[tuple[int, int]] = (),
    ) -> None:
        """Generate into the context, after filling ``prompt_tokens`` (the prompt's tail) in
        the same job."""
        new_root = target.parent_id is None and target.context_id not in self.pool.contexts
        if new_root and not prompt_tokens:
            raise UnknownContextError(
                f"context {target.context_id} does not exist: fill it first, "
                "or pass parent_context_id to fork"
            )
        self._check_tokens(prompt_tokens)
        created = target.context_id not in self.pool.contexts
        ctx = self._context_for(target)
        prompt_len = self._planned(ctx) + len(prompt_tokens)
        if prompt_len == 0:
            self._drop_if_empty(ctx)
            raise BadRequestError(
                f"context {target.context_id} is empty: fill it (or fork a filled parent) before generating"
            )
        self._check_length(ctx, len(prompt_tokens) + sampling.max_tokens, what="generate")
        job = Job(
            JobKind.GENERATE,
            ctx,
            sink,
            self._next_seq(),
            fill_tokens=list(prompt_tokens),
            sampling=sampling,
            priority=priority,
        )
        job.checkpoints = self._checkpoints(ctx, checkpoints, prompt_len)
        job.created = [ctx, *job.checkpoints] if created else list(job.checkpoints)
        self._enqueue(job, len(prompt_tokens) + sampling.max_tokens)

    def free_context(self, context_id: int) -> int:
        ctx = self.pool.contexts.get(context_id)
        if ctx is None:
            return 0  # freeing twice (or never created) is harmless
        for job in self.scheduler.jobs_of(ctx):
            error = ContextFreedError(f"context {context_id} was freed while a job was running on it")
            self._drop(job, error)
        self._planned_len.pop(context_id, None)
        return self.pool.free(ctx)

    def abort(self, context_ids: Sequence[int]) -> tuple[int, int]:
        """Stop every job on these contexts (their callers get :class:`AbortedError`) and free
        the contexts. Returns (jobs aborted, contexts freed); unknown ids are skipped."""
        jobs = freed = 0
        for context_id in context_ids:
            ctx = self.pool.contexts.get(context_id)
            if ctx is None:
                continue
            for job in self.scheduler.jobs_of(ctx):
                self._drop(job, AbortedError(f"the job on context {context_id} was aborted"))
                jobs += 1
            self._planned_len.pop(context_id, None)
            self.pool.free(ctx)
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
            self._retire(job)
            self._drop_checkpoints(job)
            for ctx in job.created:
                if not ctx.freed:
                    self._fail_forks_of(ctx)
                    self._planned_len.pop(ctx.context_id, None)
                    self.pool.free(ctx)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _check_tokens(self, token_ids: Sequence[int]) -> None:
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidTokenError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")

    def _context_for(self, target: Target) -> Context:
        context_id, parent_id, parent_len, parent_wait_s = target
        if parent_len is not None and parent_id is None:
            raise BadRequestError("parent_len needs parent_context_id")
        ctx = self.pool.contexts.get(context_id)
        if ctx is not None:
            if parent_id is not None and (parent_id != ctx.parent_id or parent_len != ctx.parent_len):
                raise ContextConflictError(
                    f"context {context_id} already exists with parent {ctx.parent_id} "
                    f"(length {ctx.parent_len}), not {parent_id} (length {parent_len})"
                )
            return ctx
        parent = None
        if parent_id is not None:
            if parent_id == context_id:
                raise BadRequestError("a context cannot be its own parent")
            parent = self.pool.contexts.get(parent_id)
            if parent is None:
                if parent_wait_s <= 0 or parent_len is None:
                    raise UnknownContextError(f"parent context {parent_id} does not exist")
                return self._orphan(target)
            if parent_len is not None and parent_len > self._planned(parent):
                raise BadRequestError(
                    f"cannot fork {parent_len} tokens of context {parent_id}: it holds "
                    f"{self._planned(parent)} (with its queued jobs)"
                )
        ctx = Context(context_id=context_id, parent=parent, parent_id=parent_id, parent_len=parent_len)
        self.pool.contexts[context_id] = ctx
        if parent is not None:
            self._planned_len[context_id] = parent_len if parent_len is not None else self._planned(parent)
        else:
            self._planned_len[context_id] = 0
        return ctx

    def _orphan(self, target: Target) -> Context:
        """A fork whose parent is not there yet: it waits (its jobs are not admitted) until
        the parent appears or ``parent_wait_s`` passes."""
        ctx = Context(context_id=target.context_id, parent_id=target.parent_id, parent_len=target.parent_len)
        ctx.parent_deadline = time.monotonic() + target.parent_wait_s
        self.pool.contexts[ctx.context_id] = ctx
        self._planned_len[ctx.context_id] = target.parent_len
        self._orphans[ctx.context_id] = ctx
        return ctx

    def _adopt_orphans(self) -> None:
        """Link waiting forks to parents that arrived; fail those whose parent never did."""
        now = time.monotonic()
        for ctx in list(self._orphans.values()):
            parent = self.pool.contexts.get(ctx.parent_id)
            error = None
            if ctx.freed:
                pass
            elif parent is not None and not parent.freed:
                if ctx.parent_len > self._planned(parent):
                    error = BadRequestError(
                        f"cannot fork {ctx.parent_len} tokens of context {ctx.parent_id}: it holds "
                        f"{self._planned(parent)} (with its queued jobs)"
                    )
                else:
                    ctx.parent, ctx.parent_deadline = parent, None
            elif now < ctx.parent_deadline:
                continue
            else:
                error = UnknownContextError(f"parent context {ctx.parent_id} does not exist")
            del self._orphans[ctx.context_id]
            if error is not None:
                for job in self.scheduler.jobs_of(ctx):
                    self._drop(job, error)
                self._planned_len.pop(ctx.context_id, None)
                self.pool.free(ctx)

    def _checkpoints(self, ctx: Context, wanted: Sequence[tuple[int, int]], prompt_len: int) -> list[Context]:
        """New, not yet made contexts that fork ``ctx`` once its prompt is computed."""
        seen: set[int] = set()
        for context_id, length in wanted:
            if context_id in self.pool.contexts or context_id in seen or context_id == ctx.context_id:
                self._drop_if_empty(ctx)
                raise ContextConflictError(f"checkpoint context {context_id} already exists")
            if not 1 <= length <= prompt_len:
                self._drop_if_empty(ctx)
                raise BadRequestError(f"checkpoint length {length} is outside the prompt (1..{prompt_len})")
            seen.add(context_id)
        made = []
        for context_id, length in wanted:
            cp = Context(context_id=context_id, parent=ctx, parent_id=ctx.context_id, parent_len=length)
            self.pool.contexts[context_id] = cp
            self._planned_len[context_id] = length
            made.append(cp)
        return made

    def _make_checkpoints(self, job: Job) -> None:
        for cp in job.checkpoints:
            if not cp.freed:
                self.pool.materialize(cp)
        job.checkpoints = []

    def _drop_checkpoints(self, job: Job) -> None:
        """Checkpoints of a job that will never compute its prompt are never made."""
        for cp in job.checkpoints:
            if not cp.freed and not cp.materialized:
                self._fail_forks_of(cp)
                self._planned_len.pop(cp.context_id, None)
                self.pool.free(cp)
        job.checkpoints = []

    def _fail_forks_of(self, ctx: Context) -> None:
        for job in [*self.scheduler.waiting]:
            if job.context.parent is ctx and not job.context.materialized:
                self._drop(job, ContextFreedError(f"context {ctx.context_id} to fork from was never made"))

    def _drop(self, job: Job, error: ParrotError) -> None:
        self.scheduler.remove(job)
        self._drop_checkpoints(job)
        job.sink.fail(error)

    def _planned(self, ctx: Context) -> int:
        """The context's length once its queued jobs ran (generations at their max_tokens)."""
        return self._planned_len.get(ctx.context_id, len(ctx.token_ids))

    def _check_length(self, ctx: Context, extra: int, what: str) -> None:
        total = self._planned(ctx) + extra
        if total > self.max_model_len:
            self._drop_if_empty(ctx)
            raise PromptTooLongError(
                f"{what} would make context {ctx.context_id} {total} tokens long "
                f"(current {self._planned(ctx)} + {extra}), over the model's context length of "
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
            self.pool.contexts.pop(ctx.context_id, None)
            self._planned_len.pop(ctx.context_id, None)

    def _enqueue(self, job: Job, extra: int) -> None:
        self._planned_len[job.context.context_id] = self._planned(job.context) + extra
        self.scheduler.add(job)

    # -- scheduler hooks -----------------------------------------------------------------
    def _prepare(self, job: Job) -> bool:
        ctx = job.context
        try:
            self.pool.materialize(ctx)
        except ParrotError as error:
            self._drop_checkpoints(job)
            job.sink.fail(error)
            self.pool.contexts.pop(ctx.context_id, None)
            self._planned_len.pop(ctx.context_id, None)
            return False
        ctx.token_ids.extend(job.fill_tokens)
        if job.kind is JobKind.GENERATE:
            params = job.sampling
            job.prompt_tokens = len(ctx.token_ids)
            job.state = GenerationState(
                sampling=SequenceSampling(params, ctx.token_ids, self.runner.device),
                detokenizer=IncrementalDetokenizer(self.tokenizer, ctx.token_ids[-8:]),
                stop=StopChecker(params.stop) if params.stop else None,
            )
        return True

    # -- the step ------------------------------------------------------------------------
    def step(self) -> bool:
        """One batched iteration; False when there was nothing to do."""
        if self._orphans:
            self._adopt_orphans()
        items = self.scheduler.schedule()
        if not items:
            return False
        jobs = {id(job.context): job for job in self.scheduler.running}
        started = time.perf_counter()
        logits = self.runner.run(items)
        for item in items:  # prompts computed now: their checkpoints fork them before sampling
            job = jobs[id(item.context)]
            if job.checkpoints and item.context.num_pending == 0:
                self._make_checkpoints(job)
        computed = sum(item.num_tokens for item in items)
        sampled = [jobs[id(item.context)] for item in items if item.sample]
        tokens = self.sampler.sample(logits, [job.state.sampling for job in sampled]) if sampled else []
        for job, token in zip(sampled, tokens, strict=True):
            self._on_token(job, token)
        for item in items:
            job = jobs[id(item.context)]
            if job.kind is JobKind.FILL and item.context.num_pending == 0:
                self._finish_fill(job)
        self._record(len(items), computed, len(tokens))
        if log.isEnabledFor(logging.DEBUG):  # a step trace, for profiling a workload
            log.debug(
                "step %d: %d items, %d tokens (%d prefill items), %d sampled, %.1f ms",
                self.steps, len(items), computed, sum(item.num_tokens > 1 for item in items),
                len(tokens), 1000 * (time.perf_counter() - started),
            )
        return True

    def _on_token(self, job: Job, token: int) -> None:
        if job.first_token_at is None:
            job.first_token_at = time.monotonic()
        params: SamplingParams = job.sampling
        state: GenerationState = job.state
        ctx = job.context
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            state.text += state.detokenizer.flush()  # a partial character held back so far
            self._finish_generate(job, "stop", token)
            return
        ctx.token_ids.append(token)
        job.generated.append(token)
        state.sampling.append(token)
        state.text += state.detokenizer.add(token)
        cut = state.stop.check(state.text) if state.stop else None
        if cut is not None:
            state.text = state.text[:cut]
            self._finish_generate(job, "stop", token, stop_string=True)
        elif len(job.generated) >= params.max_tokens or len(ctx.token_ids) >= self.max_model_len:
            state.text += state.detokenizer.flush()
            self._finish_generate(job, "length", token)
        else:
            hold = state.stop.holdback(state.text) if state.stop else 0
            self._emit(job, token, len(state.text) - hold)

    def _emit(self, job: Job, token: int, upto: int) -> None:
        state: GenerationState = job.state
        delta = state.text[state.emitted : upto] if upto > state.emitted else ""
        state.emitted = max(state.emitted, upto)
        job.sink.emit(TokenEvent(token_id=token, text=delta))

    def _finish_generate(self, job: Job, reason: str, token: int, stop_string: bool = False) -> None:
        self._emit(job, token, len(job.state.text))
        self._retire(job)
        job.sink.finish(
            GenerateResult(
                context_id=job.context.context_id,
                token_ids=list(job.generated),
                text=job.state.text,
                finish_reason=reason,
                prompt_tokens=job.prompt_tokens,
                cached_tokens=job.cached_tokens,
                stop_string=stop_string,
                first_token_s=(job.first_token_at or job.submitted_at) - job.submitted_at,
                seconds=time.monotonic() - job.submitted_at,
            )
        )

    def _finish_fill(self, job: Job) -> None:
        self._retire(job)
        ctx = job.context
        job.sink.finish(
            FillResult(
                context_id=ctx.context_id,
                filled_tokens=len(job.fill_tokens),
                context_len=len(ctx.token_ids),
                cached_tokens=job.cached_tokens,
            )
        )

    def _retire(self, job: Job) -> None:
        self.scheduler.remove(job)
        ctx = job.context
        if not self.scheduler.jobs_of(ctx):
            self._planned_len.pop(ctx.context_id, None)

    def fail_all(self, error: ParrotError) -> None:
        for job in [*self.scheduler.running, *self.scheduler.waiting]:
            self._drop(job, error)

    # -- statistics ----------------------------------------------------------------------
    def _record(self, batch_size: int, computed: int, generated: int) -> None:
        self.steps += 1
        self.batched_seqs += batch_size
        self.last_batch_size = batch_size
        self.max_batch_size = max(self.max_batch_size, batch_size)
        self.tokens_computed += computed
        self.tokens_generated += generated
        now = time.monotonic()
        self._recent.append((now, generated))
        while self._recent and now - self._recent[0][0] > _RATE_WINDOW_S:
            self._recent.popleft()

    def snapshot(self) -> dict:
        blocks = self.pool.blocks
        now = time.monotonic()
        recent = [(t, n) for t, n in self._recent if now - t <= _RATE_WINDOW_S]
        span = (now - recent[0][0]) if len(recent) > 1 else 0.0
        rate = sum(n for _, n in recent[1:]) / span if span > 0 else 0.0
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
            "shared_prefix_steps": self.runner.shared_prefix_steps,
            "preemptions": self.scheduler.num_preemptions,
            "max_model_len": self.max_model_len,
            "max_running": self.scheduler.config.max_running,
            "max_batched_tokens": self.scheduler.config.max_batched_tokens,
            "device": str(self.runner.device),
        }
