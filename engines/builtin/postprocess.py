"""The postprocess step: after the model ran a step, advance every sequence in it.

This is the one place where a step's results change state (as nano-vllm's
``Scheduler.postprocess``): what the step computed is recorded in the contexts (through the
context pool), checkpoints fork a prompt as soon as their prefix is computed, sampled tokens are appended,
streamed and checked against the stop conditions, and finished jobs leave the scheduler
with their results. The model runner before it changes nothing. What a step answers (tokens,
finished results) is posted to the engine's outbox once, at the end of the step.

A generation with an output format advances its grammar here too, token by token: it ends
("stop") once the grammar is complete, and with jump-forward the tokens the grammar forces
after a sampled one are appended with it, pending, so the next step computes them as one
multi-token item (like a prompt's tail) and samples at its end; they count as generated
(``max_tokens``, text, stream, penalties see them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from parrot.engines.builtin.batch import StepItem
from parrot.engines.builtin.constraints import Constraint, ConstraintError
from parrot.engines.builtin.context_pool import ContextPool
from parrot.engines.builtin.jobs import Answer, Final, GenerateResult, Job, JobKind, Outbox
from parrot.engines.builtin.local_scheduler import LocalScheduler
from parrot.engines.builtin.model_runner import StepOutput
from parrot.engines.builtin.sampler import RepeatedCallStop, SequenceSampling, StopChecker
from parrot.engines.builtin.tokenizer import IncrementalDetokenizer, Tokenizer
from parrot.engines.protocol.schemas import FillResponse, TokenStreamEvent
from parrot.wire.sampling import SamplingParams
from parrot.wire.tool_syntax import SYNTAXES


@dataclass(eq=False)
class GenerationState:
    sampling: SequenceSampling
    detokenizer: IncrementalDetokenizer
    stop: StopChecker | None
    text: str = ""
    emitted: int = 0  # characters of ``text`` already streamed
    unsent: int = 0  # tokens generated since the last streamed event
    sent_at: float | None = None  # when the last event was streamed (engine clock)
    constraint: Constraint | None = None  # the output format's grammar state, if any
    # Jump-forward: tokens the grammar forces at the start, taken instead of the first sample.
    forced: list[int] = field(default_factory=list)


class Postprocessor:
    def __init__(
        self,
        pool: ContextPool,
        scheduler: LocalScheduler,
        tokenizer: Tokenizer,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        device: torch.device,
        outbox: Outbox,
        jump_forward: bool = True,
    ) -> None:
        self.pool = pool
        self.outbox = outbox  # where the step's answers go, all at once
        self._answers: list[Answer] = []  # of the step being postprocessed
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.device = device
        # Tokens the grammar forces are appended at once (computed in the next step as one
        # multi-token item, like a prompt's tail) rather than decoded one step each.
        self.jump_forward = jump_forward
        self.tokens_forced = 0  # tokens jump-forward appended without sampling them (statistics)

    def sampling(self, job: Job) -> SequenceSampling:
        """The job's sampling state, made when it first samples (its prompt is complete then:
        nothing else appends to its context before)."""
        if job.state is None:
            params, ctx = job.sampling, job.context
            job.state = GenerationState(
                sampling=SequenceSampling(params, ctx.token_ids, self.device),
                detokenizer=IncrementalDetokenizer(self.tokenizer, ctx.token_ids[-8:]),
                stop=_stop_checker(params),
                constraint=Constraint(job.grammar) if job.grammar is not None else None,
            )
            if self.jump_forward and job.state.constraint is not None:
                job.state.forced = job.state.constraint.forced()
                self.tokens_forced += len(job.state.forced)
        return job.state.sampling

    def postprocess(
        self,
        items: list[StepItem],
        jobs: dict[int, Job],
        output: StepOutput,
        sampled: list[Job],
        tokens: list[int],
    ) -> None:
        """Advance the step's sequences: ``jobs`` by ``id(context)``, ``tokens`` sampled for
        ``sampled`` (in order)."""
        hidden = output.last_hidden
        for n, item in enumerate(items):
            ctx = item.context
            if item.num_tokens:
                upto = item.start + item.num_tokens
                self.pool.computed(ctx, upto, hidden[n] if upto == len(ctx.token_ids) else None)
            job = jobs[id(ctx)]
            if job.checkpoints:  # fork the prompt at each checkpoint computed by now
                self._make_checkpoints(job, ctx.num_computed)
        for job, token in zip(sampled, tokens, strict=True):
            self._on_token(job, token)
        for item in items:
            job = jobs[id(item.context)]
            if job.kind is JobKind.FILL and item.context.num_pending == 0:
                self._finish_fill(job)
        answers, self._answers = self._answers, []
        self.outbox.post(answers)

    def _make_checkpoints(self, job: Job, computed: int) -> None:
        """Each checkpoint as soon as its prefix is computed, not once the whole prompt is:
        forks waiting for it (users behind one long system prompt) join the next step
        while the rest of a chunked prompt is computed."""
        left = []
        for cp in job.checkpoints:
            if cp.parent_len is not None and cp.parent_len > computed:
                left.append(cp)
            elif not cp.freed:
                self.pool.materialize(cp)
        job.checkpoints = left

    def _on_token(self, job: Job, token: int) -> None:
        if job.first_token_at is None:
            job.first_token_at = time.monotonic()
        params: SamplingParams = job.sampling
        state: GenerationState = job.state
        constraint = state.constraint
        if state.forced:  # jump-forward from the start: the forced tokens, not the sample
            run, state.forced = state.forced, []
        elif (
            token in self.eos_token_ids and (constraint is not None or not params.ignore_eos)
        ) or token in params.stop_token_ids:
            state.text += state.detokenizer.flush()  # a partial character held back so far
            self._finish_generate(job, "stop", token)
            return
        else:
            run = [token]
        i = 0
        while i < len(run):  # the sampled token, then what the grammar forces after it
            if self._advance(job, run[i]):
                return
            i += 1
            if i == len(run) and constraint is not None and self.jump_forward:
                forced = constraint.forced()
                self.tokens_forced += len(forced)
                run.extend(forced)

    def _advance(self, job: Job, token: int) -> bool:
        """Append one generated token (sampled or forced); True when the job finished."""
        params: SamplingParams = job.sampling
        state: GenerationState = job.state
        ctx = job.context
        if state.constraint is not None:
            try:
                state.constraint.consume(token)
            except ConstraintError as error:
                self.retire(job)
                self._answers.append((job.sink, Final(error=error)))
                return True
        self.pool.append_token(ctx, token)
        job.generated.append(token)
        state.sampling.append(token)
        state.text += state.detokenizer.add(token)
        cut = state.stop.check(state.text) if state.stop else None
        if cut is not None:
            state.text = state.text[:cut] + state.stop.closing
            self._finish_generate(job, "stop", token, stop_string=True)
        elif state.constraint is not None and state.constraint.stopped:  # the value is complete
            state.text += state.detokenizer.flush()
            self._finish_generate(job, "stop", token)
        elif len(job.generated) >= params.max_tokens or len(ctx.token_ids) >= self.max_model_len:
            state.text += state.detokenizer.flush()
            self._finish_generate(job, "length", token)
        else:
            hold = state.stop.holdback(state.text) if state.stop else 0
            self._emit(job, token, len(state.text) - hold)
            return False
        return True

    def _emit(self, job: Job, token: int, upto: int, last: bool = False) -> None:
        """Stream the text up to ``upto``: the first token's at once, then per token, or
        per the sink's interval (the tokens between joined); the last one always."""
        state: GenerationState = job.state
        state.unsent += 1
        interval = job.sink.interval_s
        now = time.monotonic() if interval else 0.0  # no clock read per token without one
        if not last and state.sent_at is not None and now - state.sent_at < interval:
            return
        delta = state.text[state.emitted : upto] if upto > state.emitted else ""
        state.emitted = max(state.emitted, upto)
        event = TokenStreamEvent(token_id=token, text=delta, tokens=state.unsent)
        self._answers.append((job.sink, event))
        state.unsent, state.sent_at = 0, now

    def _finish_generate(self, job: Job, reason: str, token: int, stop_string: bool = False) -> None:
        self._emit(job, token, len(job.state.text), last=True)
        self.retire(job)
        result = GenerateResult(
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
        self._answers.append((job.sink, Final(result)))

    def _finish_fill(self, job: Job) -> None:
        self.retire(job)
        ctx = job.context
        result = FillResponse(
            context_id=ctx.context_id,
            filled_tokens=len(job.fill_tokens),
            context_len=len(ctx.token_ids),
            cached_tokens=job.cached_tokens,
        )
        self._answers.append((job.sink, Final(result)))

    def retire(self, job: Job) -> None:
        """The job is done (or its caller went away): it leaves the scheduler; a context with
        no job left is as long as planned."""
        self.scheduler.remove(job)
        ctx = job.context
        if not self.scheduler.jobs_of(ctx):
            self.pool.settle(ctx)


def _stop_checker(params: SamplingParams) -> StopChecker | None:
    if params.tool_answer:
        return RepeatedCallStop(params.stop, SYNTAXES[params.tool_syntax])
    return StopChecker(params.stop) if params.stop else None
