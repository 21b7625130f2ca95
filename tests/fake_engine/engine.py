"""The fake engine: the ``Engine`` protocol without a model (see the package's docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from fake_engine.tokens import BLOCK_SIZE, EOS, MODEL, FakeTokenizer, StopStrings, next_token
from parrot.engines.protocol.errors import (
    AbortedError,
    BadFormatError,
    BadRequestError,
    ContextConflictError,
    ContextFreedError,
    InvalidTokenError,
    ParrotError,
    PromptTooLongError,
    UnknownContextError,
)
from parrot.engines.protocol.schemas import (
    AbortResponse,
    FillResponse,
    GenerateResponse,
    StreamEnd,
    TokenStreamEvent,
)
from parrot.wire.sampling import SamplingParams


@dataclass(eq=False)
class FakeContext:
    context_id: int
    tokens: bytearray
    parent_id: int | None = None
    parent_len: int | None = None


@dataclass(eq=False)
class Job:
    context_id: int
    priority: int
    seq: int
    created: list[int] = field(default_factory=list)  # contexts its request made
    error: ParrotError | None = None  # set when it is aborted, or its context freed


class FakeEngine:
    """One fake model's engine: contexts, jobs and their order, no compute."""

    def __init__(
        self,
        *,
        model: str = MODEL,
        step_s: float = 0.0,
        max_running: int = 32,
        eos_after: int | None = None,
        max_model_len: int = 8192,
        kv_tokens: int = 1 << 20,
        cpu: bool = False,
    ) -> None:
        self.model_name = model
        self.cpu = cpu  # its pings say it runs on the CPU (as the builtin engine's there)
        self.step_s = step_s  # seconds per step (a fill, or one generated token)
        self.max_running = max_running
        self.eos_after = eos_after  # generations end after this many tokens (unless ignore_eos)
        self.max_model_len = max_model_len
        self.kv_tokens = kv_tokens
        self.hang = False  # while set, every request (pings too) and every step waits
        self.tokenizer = FakeTokenizer()
        self.contexts: dict[int, FakeContext] = {}
        self.requests: list[tuple[str, dict]] = []  # (operation, its arguments), in arrival order
        self.tokens_generated = 0
        self._failures: dict[str, list[BaseException]] = {}
        self._running: set[Job] = set()
        self._waiting: list[Job] = []
        self._seq = itertools.count()
        self._changed: asyncio.Event | None = None

    # -- knobs and inspection ---------------------------------------------------------------
    def fail_next(self, op: str, error: BaseException, times: int = 1) -> None:
        """The next ``times`` requests of ``op`` (``fill``, ``generate`` (streamed too),
        ``free_context``, ``abort``, ``ping``, ...) raise ``error``."""
        self._failures.setdefault(op, []).extend([error] * times)

    def count(self, op: str) -> int:
        return sum(1 for name, _ in self.requests if name == op)

    def text_of(self, context_id: int) -> str:
        return self.tokenizer.decode(self.contexts[context_id].tokens)

    # -- the Engine protocol ----------------------------------------------------------------
    async def fill(
        self,
        context_id: int,
        token_ids: list[int] | None = None,
        text: str | None = None,
        parent_context_id: int | None = None,
        *,
        parent_len: int | None = None,
        priority: int = 0,
        checkpoints: Sequence[tuple[int, int]] = (),
        parent_timeout_ms: int = 0,
        background: bool = False,
    ) -> FillResponse:
        await self._enter("fill", locals())
        if (token_ids is None) == (text is None):
            raise BadRequestError("fill needs exactly one of token_ids or text")
        tokens = self._tokens(token_ids, text)
        with self._job(context_id, priority) as job:
            ctx, cached = await self._start(job, parent_context_id, parent_len, parent_timeout_ms, tokens)
            self._checkpoints(job, ctx, checkpoints)
            await self._step(job)
            job.created.clear()  # done: what it made stays
            filled = {"filled_tokens": len(tokens), "context_len": len(ctx.tokens), "cached_tokens": cached}
            return FillResponse(context_id=context_id, **filled)

    async def generate(self, context_id, sampling, parent_context_id=None, **kw) -> GenerateResponse:
        async for event in self.generate_stream(context_id, sampling, parent_context_id, **kw):
            if isinstance(event, StreamEnd):
                return GenerateResponse(**{f: getattr(event, f) for f in event.__struct_fields__})
        raise AssertionError("a generation ended without its StreamEnd")

    async def generate_stream(
        self,
        context_id: int,
        sampling: SamplingParams,
        parent_context_id: int | None = None,
        *,
        parent_len: int | None = None,
        token_ids: list[int] | None = None,
        text: str | None = None,
        priority: int = 0,
        checkpoints: Sequence[tuple[int, int]] = (),
        parent_timeout_ms: int = 0,
        stream_interval_ms: int = 0,  # recorded (it streams every token whatever it is)
    ) -> AsyncIterator[TokenStreamEvent | StreamEnd]:
        await self._enter("generate", locals())
        if token_ids is not None and text is not None:
            raise BadRequestError("give the prompt tail as token_ids or as text, not both")
        if sampling.format is not None:
            raise BadFormatError("the fake engine does not constrain generation to a format")
        tail = self._tokens(token_ids, text) if (token_ids or text) else []
        with self._job(context_id, priority) as job:
            ctx, cached = await self._start(job, parent_context_id, parent_len, parent_timeout_ms, tail)
            self._checkpoints(job, ctx, checkpoints)
            prompt_tokens, stops = len(ctx.tokens), StopStrings(sampling.stop)
            generated: list[int] = []
            text_out, emitted, reason, stop_string = "", 0, "length", False
            while True:
                await self._step(job)
                ended = self.eos_after is not None and len(generated) >= self.eos_after
                token = EOS if ended and not sampling.ignore_eos else next_token(ctx.tokens)
                if token == EOS or token in sampling.stop_token_ids:
                    reason = "stop"  # the end token is not part of the context (as on the engine)
                    break
                ctx.tokens.append(token)
                generated.append(token)
                self.tokens_generated += 1
                text_out += self.tokenizer.decode([token])
                if (cut := stops.cut(text_out)) is not None:
                    text_out, reason, stop_string = text_out[:cut], "stop", True
                    break
                if len(generated) >= sampling.max_tokens or len(ctx.tokens) >= self.max_model_len:
                    break
                upto = len(text_out) - stops.holdback(text_out)
                yield TokenStreamEvent(token_id=token, text=text_out[emitted:upto])
                emitted = max(emitted, upto)
            job.created.clear()  # done: what it made stays
            yield TokenStreamEvent(token_id=token, text=text_out[emitted:])
            yield StreamEnd(
                finish_reason=reason,
                context_id=context_id,
                token_ids=generated,
                text=text_out,
                prompt_tokens=prompt_tokens,
                cached_tokens=cached,
                stop_string=stop_string,
            )

    async def free_context(self, context_id: int) -> int:
        await self._enter("free_context", locals())
        ctx = self.contexts.get(context_id)
        if ctx is None:
            return 0  # freeing twice (or never created) is harmless
        self._free(
            [context_id], lambda c: ContextFreedError(f"context {c} was freed while a job was running on it")
        )
        return len(ctx.tokens)

    async def abort(self, context_ids: Sequence[int]) -> AbortResponse:
        await self._enter("abort", locals())
        return self._abort(list(context_ids))

    async def abort_range(self, start: int, end: int) -> AbortResponse:
        await self._enter("abort_range", locals())
        return self._abort([c for c in self.contexts if start <= c < end])

    async def tokenize(self, text: str) -> list[int]:
        await self._enter("tokenize", locals())
        return self.tokenizer.encode(text)

    async def ping(self, timeout_s: float | None = None) -> dict:
        await self._enter("ping", {})
        return self.stats_now()

    async def aclose(self) -> None:
        pass

    def stats_now(self) -> dict:
        """What the builtin engine's ``/ping`` answers (the fields a ServeCore reads)."""
        used = sum(-(-len(c.tokens) // BLOCK_SIZE) for c in self.contexts.values())
        return {
            "model": self.model_name,
            "weights": "fake",
            "block_size": BLOCK_SIZE,
            "kv_blocks_total": self.kv_tokens // BLOCK_SIZE,
            "kv_blocks_used": used,
            "num_contexts": len(self.contexts),
            # An aborted job counts no more, as on the engine (whose step drops it at once);
            # here it leaves its set when its request's task next runs.
            "num_running": sum(j.error is None for j in self._running),
            "num_waiting": sum(j.error is None for j in self._waiting),
            "tokens_generated": self.tokens_generated,
            "tokens_per_s": 0.0,
            "max_model_len": self.max_model_len,
            "max_running": self.max_running,
            "heartbeat_age_s": 0.0,
            **({"cpu": {"isa": "fake"}} if self.cpu else {}),
        }

    # -- jobs -------------------------------------------------------------------------------
    async def _enter(self, op: str, args: dict) -> None:
        self.requests.append((op, {k: v for k, v in args.items() if k != "self"}))
        while self.hang:
            await asyncio.sleep(0.01)
        if failures := self._failures.get(op):
            raise failures.pop(0)

    def _tokens(self, token_ids: Sequence[int] | None, text: str | None) -> list[int]:
        if token_ids is None:
            return self.tokenizer.encode(text or "")
        if (bad := next((t for t in token_ids if not 0 <= t < EOS), None)) is not None:
            raise InvalidTokenError(f"token id {bad} is outside the vocabulary (0..{EOS - 1})")
        return list(token_ids)

    @contextlib.contextmanager
    def _job(self, context_id: int, priority: int) -> Iterator[Job]:
        """A job's life: whatever its request made goes with it unless it finished (a failure,
        or a caller that went away, as on the engine)."""
        job = Job(context_id, priority, next(self._seq))
        try:
            yield job
        finally:
            for created in job.created:
                self.contexts.pop(created, None)
            self._running.discard(job)
            self._notify()

    async def _start(
        self, job: Job, parent_id: int | None, parent_len: int | None, parent_wait_ms: int, tokens: list[int]
    ) -> tuple[FakeContext, int]:  # fmt: skip
        """Find or fork the job's context (a parent on its way is waited for), wait for room,
        then append the job's tokens; returns the context and the tokens it did not compute."""
        if parent_len is not None and parent_id is None:
            raise BadRequestError("parent_len needs parent_context_id")
        if parent_id is not None and parent_id == job.context_id:
            raise BadRequestError("a context cannot be its own parent")
        ctx = self.contexts.get(job.context_id)
        if (
            ctx is not None
            and parent_id is not None
            and (parent_id, parent_len) != (ctx.parent_id, ctx.parent_len)
        ):
            raise ContextConflictError(
                f"context {job.context_id} already exists with parent {ctx.parent_id} "
                f"(length {ctx.parent_len}), not {parent_id} (length {parent_len})"
            )
        if ctx is None and parent_id is not None and parent_id not in self.contexts:
            if parent_wait_ms > 0 and parent_len is not None:
                await self._wait(lambda: parent_id in self.contexts, parent_wait_ms / 1000)
            if parent_id not in self.contexts:
                raise UnknownContextError(f"parent context {parent_id} does not exist")
        await self._admit(job)
        if ctx is None:
            ctx = FakeContext(job.context_id, bytearray(), parent_id, parent_len)
            if parent_id is not None:
                if (parent := self.contexts.get(parent_id)) is None:
                    raise ContextFreedError(f"parent context {parent_id} was freed before the fork")
                length = len(parent.tokens) if parent_len is None else parent_len
                if length > len(parent.tokens):
                    raise BadRequestError(f"cannot fork {length} tokens of context {parent_id}")
                ctx.tokens[:] = parent.tokens[:length]
            self.contexts[job.context_id] = ctx
            job.created.append(job.context_id)
            self._notify()
        if len(ctx.tokens) + len(tokens) > self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ctx.tokens) + len(tokens)} tokens, over the model's"
            )
        cached = len(ctx.tokens)
        ctx.tokens.extend(tokens)
        return ctx, cached

    def _checkpoints(self, job: Job, ctx: FakeContext, wanted: Sequence[tuple[int, int]]) -> None:
        """Contexts forked from the job's at these lengths, once its prompt is in."""
        for context_id, length in wanted:
            if context_id in self.contexts:
                raise ContextConflictError(f"checkpoint context {context_id} already exists")
            if not 1 <= length <= len(ctx.tokens):
                raise BadRequestError(f"checkpoint length {length} is outside the prompt")
        for context_id, length in wanted:
            self.contexts[context_id] = FakeContext(context_id, ctx.tokens[:length], ctx.context_id, length)
            job.created.append(context_id)

    async def _admit(self, job: Job) -> None:
        """Wait until fewer than ``max_running`` jobs run and no waiting job goes first."""
        self._waiting.append(job)

        def admissible() -> bool:
            first = min(self._waiting, key=lambda j: (-j.priority, j.seq))
            return job.error is not None or (len(self._running) < self.max_running and job is first)

        try:
            await self._wait(admissible)
        finally:
            self._waiting.remove(job)
        if job.error is not None:
            raise job.error
        self._running.add(job)

    async def _step(self, job: Job) -> None:
        """One engine step of the job: time passes (``step_s``); an aborted job stops here."""
        await asyncio.sleep(self.step_s)
        while self.hang:
            await asyncio.sleep(0.01)
        if job.error is not None:
            raise job.error

    def _abort(self, context_ids: list[int]) -> AbortResponse:
        known = [c for c in context_ids if c in self.contexts]
        jobs = self._free(known, lambda c: AbortedError(f"the job on context {c} was aborted"))
        return AbortResponse(aborted_jobs=jobs, freed_contexts=len(known))

    def _free(self, context_ids: list[int], error: Callable[[int], ParrotError]) -> int:
        """Free contexts; the jobs on them fail with ``error``. Returns how many jobs."""
        ids = set(context_ids)
        jobs = [j for j in (*self._running, *self._waiting) if j.context_id in ids and j.error is None]
        for job in jobs:
            job.error = error(job.context_id)
        for context_id in ids:
            self.contexts.pop(context_id, None)
        self._notify()
        return len(jobs)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait(self, ready: Callable[[], bool], timeout_s: float | None = None) -> None:
        """Until ``ready()`` (or ``timeout_s``), woken by every change of jobs or contexts."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not ready():
            left = 0.05 if deadline is None else min(deadline - loop.time(), 0.05)
            if left <= 0:
                return
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=left)
