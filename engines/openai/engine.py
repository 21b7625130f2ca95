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

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import httpx2
import openai

from parrot.engines.openai.admission import Admission
from parrot.engines.openai.backends import Backend, detect, refuses_priority, request_fields
from parrot.engines.openai.config import CHAT, OpenAIEngineConfig
from parrot.engines.openai.contexts import ContextStore, TextContext
from parrot.engines.openai.failures import Failure, classify
from parrot.engines.openai.health import EndpointHealth
from parrot.engines.openai.request import build_request, choice_text, usage_counts
from parrot.engines.openai.slots import Slot
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
        self._base_url = base_url  # (credentials go to the transport, never into a URL logged)
        auth = httpx2.BasicAuth(*credentials) if credentials else None
        self._http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [self._count_retry]}, auth=auth)
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=config.key,
            max_retries=config.max_retries,
            timeout=config.timeout_s,
            http_client=self._http,
        )
        self._contexts = ContextStore()
        self.health = EndpointHealth(self._where, config.cooldown_s)
        self.backend: Backend | None = None  # found at the first ping that answers
        self.admission = Admission(config.capacity or config.default_capacity)
        self._model_listed: bool | None = None

    def __repr__(self) -> str:
        d = self.config.describe()
        return f"OpenAIEngine(base_url={d['base_url']!r}, model={d['model']!r}, api={d['api']!r})"

    def describe(self) -> dict:
        return {**self.config.describe(), "capacity": self.capacity}

    @property
    def capacity(self) -> int:
        """Requests at once: as configured, else what the server says it runs at once (a
        llama.cpp server's slots, SGLang's ``max_running_requests``), else the default."""
        running = self.backend.running if self.backend is not None else None
        return self.config.capacity or running or self.config.default_capacity

    @property
    def healthy(self) -> bool:
        return self.health.healthy

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
        self._contexts.mark_checkpoints(ctx, checkpoints, created)
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
        ctx, created = self._contexts.target(context_id, parent_context_id, parent_len, token_ids, text)
        try:
            self._contexts.mark_checkpoints(ctx, checkpoints, created)
            prompt = self._prompt(ctx)
            async with self.admission.request(prompt, sampling.max_tokens) as slot:
                request = self._request(prompt, sampling, slot, priority)
                answer = await self._call(lambda: self._send(request, stream=False))
                choices = getattr(answer, "choices", None)
                if not choices:
                    raise ParrotError(f"{self._where} answered without a choice")
                out = choice_text(self.config.api, choices[0])
                self.admission.answered(slot, prompt, out, answer)
        except BaseException:
            if created:
                self._contexts.forget(context_id, checkpoints)
            raise
        choice = choices[0]
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
        ctx, created = self._contexts.target(context_id, parent_context_id, parent_len, token_ids, text)
        pieces: list[str] = []
        finished = False
        try:
            self._contexts.mark_checkpoints(ctx, checkpoints, created)
            prompt = self._prompt(ctx)
            state: dict[str, Any] = {"finish": None, "usage": None}
            async with self.admission.request(prompt, sampling.max_tokens) as slot:
                request = self._request(prompt, sampling, slot, priority)
                failure = None
                try:
                    chunks = 0
                    async with await self._send(request, stream=True) as stream:
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
                    self.health.fail(failure)
                self.admission.answered(slot, prompt, "".join(pieces), state.get("last"))
            self.health.succeeded()
            finished = True
        finally:
            if finished or not created:
                ctx.append("".join(pieces))
            else:
                self._contexts.forget(context_id, checkpoints)
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
        self.health.check()
        timeout = min(self.config.timeout_s, timeout_s or PING_TIMEOUT_S)
        failure = None
        models: list[Any] = []
        try:  # one probe: the monitor pings again soon
            page = await self._client.with_options(max_retries=0).models.list(timeout=timeout)
            models = list(page.data)
            self._model_listed = any(m.id == self.config.model for m in models)
        except _CLIENT_ERRORS as error:
            failure = classify(error, self._where, timeout, self._redact)
        if failure is not None and failure.hard:
            self.health.unhealthy = str(failure.error)
            self.backend = None  # it may come back as another server, or with other flags
            raise failure.error
        if failure is not None:
            self._model_listed = None  # it answered, with a 4xx (no /models here): reachable
        self.health.answered()
        if self.backend is None:
            config = self.config
            self._found(await detect(self._http, self._base_url, models, config.model, config.key))
        return self.stats()

    def stats(self) -> dict:
        return {
            "model": self.config.model,
            "kind": "openai",
            **self.describe(),
            **(self.backend or Backend()).describe(),
            "max_running": self.capacity,
            "healthy": self.healthy,
            "model_listed": self._model_listed,
            "num_running": self.admission.running,
            "num_waiting": self.admission.waiting,
            "num_contexts": len(self._contexts),
            "context_chars": self._contexts.own_chars(),
            "requests_done": self.health.done,
            "requests_failed": self.health.failed,
            "retries": self.health.retries,
            "waited_for_prefix": self.admission.waited_for_prefix,
        }

    def _found(self, backend: Backend) -> None:
        """The endpoint is ``backend``: plan a llama.cpp server's slots (unless configured
        otherwise), with as many requests at once as it runs unless a capacity is set."""
        if self.backend is None or backend.kind != self.backend.kind:
            running = f" running {backend.running} at once" if backend.running else ""
            priority = ", priorities on" if backend.priority else ""
            log.info("%s is a %s server%s%s", self._where, backend.kind, running, priority)
        self.backend = backend
        slots = backend.slots if self.config.plan_slots else None
        self.admission.configure(self.capacity, slots, bounded=self.config.capacity is not None)

    def kept_prefix(self, prompt: str) -> int | None:
        """Characters of ``prompt`` a request could use in the server's slots now (None:
        the server's slots are not planned here)."""
        return self.admission.kept_prefix(prompt)

    def worth_queueing(self, prompt: str, elsewhere_shared: int, elsewhere_busy: int) -> bool:
        """Whether ``prompt`` had better wait here, its server's slots all taken, for the
        slot holding its prefix than run on another server (see
        :meth:`~parrot.engines.openai.slots.SlotPlanner.worth_queueing`)."""
        return self.admission.worth_queueing(prompt, elsewhere_shared, elsewhere_busy)

    async def aclose(self) -> None:
        await self._client.close()

    # -- internals ---------------------------------------------------------------------
    def _prompt(self, ctx: TextContext) -> str:
        if len(ctx) == 0:
            raise BadRequestError(
                f"context {ctx.context_id} is empty: fill it (or fork a filled parent) before generating"
            )
        return ctx.text()

    def _request(self, prompt: str, sampling: SamplingParams, slot: Slot | None, priority: int) -> dict:
        request = build_request(self.config, prompt, sampling)
        fields = request_fields(self.backend or Backend(), slot.index if slot else None, priority)
        if fields:
            request["extra_body"] = {**request.get("extra_body", {}), **fields}
        return request

    def _create(self, request: dict[str, Any], stream: bool) -> Awaitable[Any]:
        extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        api = self._client.chat.completions if self.config.api == CHAT else self._client.completions
        return api.create(**request, **extra)

    async def _send(self, request: dict[str, Any], stream: bool) -> Any:
        """The request's answer (a stream: opened); sent again without ``priority`` when
        the endpoint refuses it (vLLM without priority scheduling), which it then never gets."""
        try:
            return await self._create(request, stream)
        except openai.BadRequestError as error:
            if "priority" not in request.get("extra_body", {}) or not refuses_priority(str(error)):
                raise
        log.warning("%s refuses request priorities: they are no longer sent to it", self._where)
        self.backend = (self.backend or Backend()).without_priority()
        body = {k: v for k, v in request["extra_body"].items() if k != "priority"}
        return await self._create({**request, "extra_body": body}, stream)

    def _read_chunk(self, chunk: Any, state: dict[str, Any]) -> str:
        if getattr(chunk, "usage", None) is not None:
            state["usage"] = chunk.usage
        if (chunk.model_extra or {}).get("timings"):
            state["last"] = chunk  # llama.cpp's timings come with its last chunks
        text = ""
        for choice in chunk.choices or ():
            if choice.index == 0:
                text += choice_text(self.config.api, choice)
                state["finish"] = choice.finish_reason or state["finish"]
        return text

    async def _call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """One request (the client retries it)."""
        try:
            result = await attempt()
        except _CLIENT_ERRORS as error:
            failure = classify(error, self._where, self.config.timeout_s, self._redact)
        else:
            self.health.succeeded()
            return result
        self.health.fail(failure)  # outside the except block: not chained to the client's exception

    async def _count_retry(self, request: httpx2.Request) -> None:
        if request.headers.get("x-stainless-retry-count", "0") != "0":
            self.health.retries += 1

    def _redact(self, text: str) -> str:
        key = self.config.api_key
        return text.replace(key, "***") if key and len(key) >= 4 else text
