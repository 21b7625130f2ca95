"""The OpenAI engine: the ServeCore's ``Engine`` protocol over an OpenAI-compatible endpoint.

Contexts are text (:mod:`parrot.engines.openai.contexts`): ``fill`` appends text,
``generate`` sends a context's whole text to the endpoint, through the completions API
(verbatim) or the chat API (mapped onto messages, :mod:`parrot.engines.openai.chat_messages`), and
appends the answer. Lengths in responses are characters; ``token_ids`` are always empty
and stream events carry ``token_id=-1`` (the endpoint's tokens are not seen here), while
``prompt_tokens`` / ``cached_tokens`` are the endpoint's own usage counts when it reports them.

Failures are retried by the ``openai`` client itself (``max_retries``: 408, 409, 429, 5xx,
timeouts and connection errors, with exponential backoff that honours ``Retry-After``,
``retry-after-ms`` and ``x-should-retry``); what is left is mapped onto Parrot's errors
(:mod:`parrot.engines.openai.failures`). After a final availability failure the engine is
unhealthy: ``ping`` raises :class:`EngineUnavailableError` for ``cooldown_s``, then probes
``GET /models`` again. A stream is retried only while it is being opened: once text went
out, a retry would repeat it to the consumer.

The API key is sent to the endpoint and nowhere else: not in ``repr``, errors or logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, NoReturn, TypeVar

import httpx2
import openai

from parrot.engines.openai.config import CHAT, OpenAIEngineConfig
from parrot.engines.openai.contexts import ContextStore, TextContext
from parrot.engines.openai.failures import Failure, classify
from parrot.engines.openai.request import build_request, choice_text, usage_counts
from parrot.engines.protocol.errors import (
    BadEngineAnswerError,
    BadRequestError,
    EngineUnavailableError,
    ParrotError,
)
from parrot.engines.protocol.schemas import (
    AbortResponse,
    FillResponse,
    GenerateResponse,
    StreamEnd,
    TokenStreamEvent,
)
from parrot.engines.protocol.urls import split_credentials
from parrot.wire.sampling import SamplingParams

log = logging.getLogger(__name__)

PING_TIMEOUT_S: Final = 5.0
_CLIENT_ERRORS = (openai.APIError, httpx2.TransportError)
# The ServeCore streams every generation (its variables can be followed as they are written).
NOT_STREAMED = "answered a streamed request without an event stream: the endpoint must support `stream: true`"
T = TypeVar("T")


class OpenAIEngine:
    """An OpenAI-compatible endpoint as a Parrot engine, used in-process by the ServeCore."""

    def __init__(self, config: OpenAIEngineConfig) -> None:
        self.config = config
        self._where = f"openai endpoint {config.public_url}"
        # The client's retries count here through its retry header (for ping's statistics).
        # Credentials inside base_url go to the transport as its auth: the client logs the
        # URLs it requests, and a password must be in none of them.
        base_url, credentials = split_credentials(config.base_url)
        auth = httpx2.BasicAuth(*credentials) if credentials else None
        transport = openai.DefaultAsyncHttpxClient(event_hooks={"request": [self._count_retry]}, auth=auth)
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=config.key,
            max_retries=config.max_retries,
            timeout=config.timeout_s,
            http_client=transport,
        )
        self._contexts = ContextStore()
        self._slots = asyncio.Semaphore(config.capacity)
        self._running = self._waiting = 0
        self._done = self._failed = self._retries = 0
        self._unhealthy: str | None = None  # why, while unhealthy
        self._down_until = 0.0  # monotonic; ping raises before it
        self._model_listed: bool | None = None

    def __repr__(self) -> str:
        d = self.config.describe()
        return f"OpenAIEngine(base_url={d['base_url']!r}, model={d['model']!r}, api={d['api']!r})"

    def describe(self) -> dict:
        return self.config.describe()

    @property
    def healthy(self) -> bool:
        return self._unhealthy is None

    # -- the Engine protocol -----------------------------------------------------------
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
        parent_timeout_ms: int = 0,  # in-process: a parent exists before its forks are asked for
        background: bool = False,  # an endpoint has no steps to share
    ) -> FillResponse:
        """Append ``text`` to the context (created, forked from the parent, when new).
        Lengths are in characters; ``priority`` means nothing to an endpoint."""
        if token_ids is not None:
            raise BadRequestError("an openai engine's contexts are text: fill with text, not token_ids")
        if text is None:
            raise BadRequestError("fill needs text")
        created = self._contexts.get(context_id) is None
        ctx = self._contexts.context_for(context_id, parent_context_id, parent_len)
        ctx.append(text)
        self._checkpoints(ctx, checkpoints, created)
        return FillResponse(context_id=context_id, filled_tokens=len(text), context_len=len(ctx))

    async def generate(
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
        parent_timeout_ms: int = 0,  # in-process: a parent exists before its forks are asked for
    ) -> GenerateResponse:
        ctx, created = self._target(context_id, parent_context_id, parent_len, token_ids, text)
        try:
            self._checkpoints(ctx, checkpoints, created)
            request = self._request(ctx, sampling)
            answer = await self._call(lambda: self._create(request, stream=False))
            choices = getattr(answer, "choices", None)
            if not choices:
                raise ParrotError(f"{self._where} answered without a choice")
            choice = choices[0]
        except BaseException:
            if created:
                self._forget(context_id, checkpoints)
            raise
        out = choice_text(self.config.api, choice)
        ctx.append(out)
        prompt_tokens, cached = usage_counts(answer.usage)
        return GenerateResponse(
            context_id=context_id,
            token_ids=[],
            text=out,
            finish_reason=choice.finish_reason or "stop",
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
        )

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
        parent_timeout_ms: int = 0,  # in-process: a parent exists before its forks are asked for
        stream_interval_ms: int = 0,  # in-process: an event costs no HTTP; the backend's pace
    ) -> AsyncIterator[TokenStreamEvent | StreamEnd]:
        """A :class:`TokenStreamEvent` per text delta (``token_id=-1``), then :class:`StreamEnd`."""
        ctx, created = self._target(context_id, parent_context_id, parent_len, token_ids, text)
        pieces: list[str] = []
        finished = False
        try:
            self._checkpoints(ctx, checkpoints, created)
            request = self._request(ctx, sampling)
            state: dict[str, Any] = {"finish": None, "usage": None}
            async with self._slot():
                failure = None
                try:
                    chunks = 0
                    async with await self._create(request, stream=True) as stream:
                        async for chunk in stream:
                            chunks += 1
                            delta = self._read_chunk(chunk, state)
                            if delta:
                                pieces.append(delta)
                                yield TokenStreamEvent(token_id=-1, text=delta)
                    if not chunks:  # not an event stream (a JSON answer reads as none): say so
                        failure = Failure(BadEngineAnswerError(f"{self._where} {NOT_STREAMED}"))
                except _CLIENT_ERRORS as error:
                    failure = classify(error, self._where, self.config.timeout_s, self._redact)
                if failure is not None:
                    if pieces:  # text went out already: the consumer has seen part of an answer
                        failure = Failure(EngineUnavailableError(f"{failure.error} (mid-stream)"), hard=True)
                    # outside the except block: the client's exception (which holds the
                    # request, key included) is not chained to the error raised here
                    self._fail(failure)
            self._succeeded()
            finished = True
        finally:
            if finished or not created:
                ctx.append("".join(pieces))
            else:
                self._forget(context_id, checkpoints)
        prompt_tokens, cached = usage_counts(state["usage"])
        yield StreamEnd(
            finish_reason=state["finish"] or "stop",
            context_id=context_id,
            token_ids=[],
            text="".join(pieces),
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
        )

    async def free_context(self, context_id: int) -> int:
        """Forget the context; returns the characters it held itself (forks of it keep working)."""
        return self._contexts.free(context_id)

    async def abort(self, context_ids: list[int]) -> AbortResponse:
        """Forget these contexts. A request in flight for one of them is stopped by its
        caller cancelling it (this engine runs in the caller's process)."""
        freed = sum(1 for cid in context_ids if self._contexts.get(cid) is not None)
        for cid in context_ids:
            self._contexts.free(cid)
        return AbortResponse(aborted_jobs=0, freed_contexts=freed)

    async def ping(self, timeout_s: float | None = None) -> dict:
        """Load and health. Probes ``GET /models`` (short timeout); raises
        :class:`EngineUnavailableError` when the endpoint is unreachable or rejects the key,
        and during the cool-down after a hard failure."""
        remaining = self._down_until - time.monotonic()
        if self._unhealthy is not None and remaining > 0:
            raise EngineUnavailableError(
                f"{self._where} is unhealthy ({self._unhealthy}); next probe in {remaining:.1f} s"
            )
        timeout = min(self.config.timeout_s, timeout_s or PING_TIMEOUT_S)
        failure = None
        try:  # one probe: the monitor pings again soon
            page = await self._client.with_options(max_retries=0).models.list(timeout=timeout)
            self._model_listed = any(m.id == self.config.model for m in page.data)
        except _CLIENT_ERRORS as error:
            failure = classify(error, self._where, timeout, self._redact)
        if failure is not None and failure.hard:
            self._unhealthy = str(failure.error)
            raise failure.error
        if failure is not None:
            self._model_listed = None  # it answered, with a 4xx (no /models here): reachable
        self._unhealthy = None
        return self.stats()

    def stats(self) -> dict:
        return {
            "model": self.config.model,
            "kind": "openai",
            **self.config.describe(),
            "healthy": self.healthy,
            "model_listed": self._model_listed,
            "num_running": self._running,
            "num_waiting": self._waiting,
            "num_contexts": len(self._contexts),
            "context_chars": self._contexts.own_chars(),
            "requests_done": self._done,
            "requests_failed": self._failed,
            "retries": self._retries,
        }

    async def aclose(self) -> None:
        await self._client.close()

    # -- internals ---------------------------------------------------------------------
    def _target(
        self,
        context_id: int,
        parent_id: int | None,
        parent_len: int | None,
        token_ids: list[int] | None,
        tail: str | None,
    ) -> tuple[TextContext, bool]:
        """The context a generation runs in, with its prompt ``tail`` appended."""
        if token_ids:
            raise BadRequestError("an openai engine's contexts are text: give the prompt as text")
        created = self._contexts.get(context_id) is None
        ctx = self._contexts.existing(context_id, parent_id, parent_len, tail or "")
        if tail:
            ctx.append(tail)
        return ctx, created

    def _checkpoints(self, ctx: TextContext, marks: Sequence[tuple[int, int]], created: bool) -> None:
        try:
            for context_id, length in marks:
                self._contexts.checkpoint(context_id, ctx, length)
        except ParrotError:
            self._forget(ctx.context_id if created else None, marks)
            raise

    def _forget(self, context_id: int | None, marks: Sequence[tuple[int, int]]) -> None:
        """Undo a request that failed: the context it created, and its checkpoints."""
        if context_id is not None:
            self._contexts.free(context_id)
        for cid, _ in marks:
            self._contexts.free(cid)

    def _request(self, ctx: TextContext, sampling: SamplingParams) -> dict[str, Any]:
        if len(ctx) == 0:
            raise BadRequestError(
                f"context {ctx.context_id} is empty: fill it (or fork a filled parent) before generating"
            )
        return build_request(self.config, ctx.text(), sampling)

    def _create(self, request: dict[str, Any], stream: bool) -> Awaitable[Any]:
        extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        api = self._client.chat.completions if self.config.api == CHAT else self._client.completions
        return api.create(**request, **extra)

    def _read_chunk(self, chunk: Any, state: dict[str, Any]) -> str:
        if getattr(chunk, "usage", None) is not None:
            state["usage"] = chunk.usage
        text = ""
        for choice in chunk.choices or ():
            if choice.index == 0:
                text += choice_text(self.config.api, choice)
                state["finish"] = choice.finish_reason or state["finish"]
        return text

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        """One of ``capacity`` requests in flight."""
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._slots.release()

    async def _call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """One request (the client retries it), in a capacity slot."""
        async with self._slot():
            try:
                result = await attempt()
            except _CLIENT_ERRORS as error:
                failure = classify(error, self._where, self.config.timeout_s, self._redact)
            else:
                self._succeeded()
                return result
            self._fail(failure)  # outside the except block: not chained to the client's exception

    def _fail(self, failure: Failure) -> NoReturn:
        self._failed += 1
        if failure.hard:
            self._mark_unhealthy(str(failure.error))
        raise failure.error

    async def _count_retry(self, request: httpx2.Request) -> None:
        if request.headers.get("x-stainless-retry-count", "0") != "0":
            self._retries += 1

    def _succeeded(self) -> None:
        self._done += 1
        if self._unhealthy is not None:
            log.info("%s answers again", self._where)
        self._unhealthy = None
        self._down_until = 0.0

    def _mark_unhealthy(self, reason: str) -> None:
        self._unhealthy = reason
        self._down_until = time.monotonic() + self.config.cooldown_s
        log.warning("%s is unhealthy for %g s: %s", self._where, self.config.cooldown_s, reason)

    def _redact(self, text: str) -> str:
        key = self.config.api_key
        return text.replace(key, "***") if key and len(key) >= 4 else text
