"""The engine core: all state of one engine, owned and mutated by the engine thread only.

Requests arrive as commands (``submit_fill``, ``submit_generate``, ``free_context``) and
are validated here, against the contexts as they are; then ``step`` runs one batched model
iteration and hands results back through each job's sink.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from parrot.engines.builtin.context import Context, ContextPool
from parrot.engines.builtin.jobs import (
    FillResult,
    GenerateResult,
    Job,
    JobKind,
    JobSink,
    TokenEvent,
)
from parrot.engines.builtin.runner import ModelRunner
from parrot.engines.builtin.sampler import Sampler, SequenceSampling, StopChecker
from parrot.engines.builtin.scheduler import LocalScheduler
from parrot.engines.builtin.tokenizer import IncrementalDetokenizer, Tokenizer
from parrot.engines.protocol.errors import (
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
        self, context_id: int, parent_id: int | None, token_ids: Sequence[int], sink: JobSink
    ) -> None:
        if not token_ids:
            raise BadRequestError("fill needs at least one token (token_ids or text was empty)")
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidTokenError(f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        ctx = self._context_for(context_id, parent_id)
        self._check_length(ctx, len(token_ids), what="fill")
        self._enqueue(
            Job(JobKind.FILL, ctx, sink, self._next_seq(), fill_tokens=list(token_ids)), len(token_ids)
        )

    def submit_generate(
        self, context_id: int, parent_id: int | None, sampling: SamplingParams, sink: JobSink
    ) -> None:
        if parent_id is None and context_id not in self.pool.contexts:
            raise UnknownContextError(
                f"context {context_id} does not exist: fill it first, or pass parent_context_id to fork"
            )
        ctx = self._context_for(context_id, parent_id)
        if self._planned(ctx) == 0:
            raise BadRequestError(
                f"context {context_id} is empty: fill it (or fork a filled parent) before generating"
            )
        self._check_length(ctx, sampling.max_tokens, what="generate")
        self._enqueue(
            Job(JobKind.GENERATE, ctx, sink, self._next_seq(), sampling=sampling), sampling.max_tokens
        )

    def free_context(self, context_id: int) -> int:
        ctx = self.pool.contexts.get(context_id)
        if ctx is None:
            return 0  # freeing twice (or never created) is harmless
        for job in self.scheduler.jobs_of(ctx):
            self.scheduler.remove(job)
            job.sink.fail(ContextFreedError(f"context {context_id} was freed while a job was running on it"))
        self._planned_len.pop(context_id, None)
        return self.pool.free(ctx)

    def cancel(self, sink: JobSink) -> None:
        """Drop the jobs whose caller went away (a closed stream); their contexts stay valid."""
        for job in self.scheduler.jobs_of_sink(sink):
            self._retire(job)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _context_for(self, context_id: int, parent_id: int | None) -> Context:
        ctx = self.pool.contexts.get(context_id)
        if ctx is not None:
            if parent_id is not None and parent_id != ctx.parent_id:
                raise ContextConflictError(
                    f"context {context_id} already exists with parent {ctx.parent_id}, not {parent_id}"
                )
            return ctx
        parent = None
        if parent_id is not None:
            if parent_id == context_id:
                raise BadRequestError("a context cannot be its own parent")
            parent = self.pool.contexts.get(parent_id)
            if parent is None:
                raise UnknownContextError(f"parent context {parent_id} does not exist")
        ctx = Context(context_id=context_id, parent=parent, parent_id=parent_id)
        self.pool.contexts[context_id] = ctx
        self._planned_len[context_id] = self._planned(parent) if parent is not None else 0
        return ctx

    def _planned(self, ctx: Context) -> int:
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
            job.sink.fail(error)
            self.pool.contexts.pop(ctx.context_id, None)
            self._planned_len.pop(ctx.context_id, None)
            return False
        if job.kind is JobKind.FILL:
            ctx.token_ids.extend(job.fill_tokens)
        else:
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
        items = self.scheduler.schedule()
        if not items:
            return False
        jobs = {id(job.context): job for job in self.scheduler.running}
        logits = self.runner.run(items)
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
        return True

    def _on_token(self, job: Job, token: int) -> None:
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
            self._finish_generate(job, "stop", token)
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

    def _finish_generate(self, job: Job, reason: str, token: int) -> None:
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
            self.scheduler.remove(job)
            job.sink.fail(error)

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
            "device": str(self.runner.device),
        }
