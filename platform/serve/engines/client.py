"""How the ServeCore talks to an engine: the ``Engine`` protocol and its HTTP client.

A remote builtin engine and an in-process OpenAI engine are used the same way.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import httpx
import msgspec
from httpx_sse import EventSource, SSEError

from parrot.engines.protocol.errors import EngineUnavailableError, ParrotError
from parrot.engines.protocol.schemas import (
    AbortRangeRequest,
    AbortRequest,
    AbortResponse,
    Checkpoint,
    FillRequest,
    FillResponse,
    FreeContextRequest,
    FreeContextResponse,
    GenerateRequest,
    GenerateResponse,
    RenderChatRequest,
    RenderChatResponse,
    StreamEnd,
    TokenizeRequest,
    TokenizeResponse,
    TokenStreamEvent,
)
from parrot.engines.protocol.urls import public_url, split_credentials
from parrot.wire.errors import error_for
from parrot.wire.sampling import SamplingParams

Checkpoints = Sequence[tuple[int, int]]  # (context id, length): forks kept once the prompt is computed


class Engine(Protocol):
    """What the ServeCore needs of an engine. New contexts fork ``parent_context_id`` at
    ``parent_len`` (all of it when None), waiting up to ``parent_timeout_ms`` for a parent
    whose own request may still be on its way; ``token_ids``/``text`` on a generation are
    its prompt's tail, filled in the same job; higher ``priority`` runs first."""

    async def fill(
        self,
        context_id: int,
        token_ids: list[int] | None = None,
        text: str | None = None,
        parent_context_id: int | None = None,
        *,
        parent_len: int | None = None,
        priority: int = 0,
        checkpoints: Checkpoints = (),
        parent_timeout_ms: int = 0,
        background: bool = False,
    ) -> FillResponse: ...

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
        checkpoints: Checkpoints = (),
        parent_timeout_ms: int = 0,
    ) -> GenerateResponse: ...

    def generate_stream(
        self,
        context_id: int,
        sampling: SamplingParams,
        parent_context_id: int | None = None,
        *,
        parent_len: int | None = None,
        token_ids: list[int] | None = None,
        text: str | None = None,
        priority: int = 0,
        checkpoints: Checkpoints = (),
        parent_timeout_ms: int = 0,
        stream_interval_ms: int = 0,
    ) -> AsyncIterator[TokenStreamEvent | StreamEnd]: ...

    async def free_context(self, context_id: int) -> int: ...

    async def abort(self, context_ids: list[int]) -> AbortResponse: ...

    async def ping(self, timeout_s: float | None = None) -> dict: ...

    async def aclose(self) -> None: ...


def _checkpoints(marks: Checkpoints) -> list[Checkpoint]:
    return [Checkpoint(context_id=c, length=n) for c, n in marks]


class HttpEngine:
    """A builtin engine (``parrot engine``) reached over HTTP."""

    def __init__(self, base_url: str, timeout_s: float = 600.0, ping_timeout_s: float = 2.0) -> None:
        self.public_url = public_url(base_url)  # for messages: without credentials
        # Credentials in the URL (an engine behind a proxy with Basic auth) go to the client
        # as its auth, so they are in no URL it logs.
        self.base_url, credentials = split_credentials(base_url.rstrip("/"))
        self.ping_timeout_s = ping_timeout_s
        # Generations may take long: a hung engine is found by its pings, not by this timeout.
        limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout_s,
            limits=limits,
            auth=httpx.BasicAuth(*credentials) if credentials else None,
        )

    async def _post(self, path: str, body: msgspec.Struct) -> bytes:
        try:
            r = await self._client.post(
                path, content=msgspec.json.encode(body), headers={"content-type": "application/json"}
            )
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"engine {self.public_url} unreachable: {error!r}") from error
        if r.status_code >= 400:
            raise _engine_error(r.status_code, r.content, self.public_url)
        return r.content

    async def fill(
        self,
        context_id,
        token_ids=None,
        text=None,
        parent_context_id=None,
        *,
        parent_len=None,
        priority=0,
        checkpoints=(),
        parent_timeout_ms=0,
        background=False,
    ) -> FillResponse:
        body = FillRequest(
            background=background,
            context_id=context_id,
            parent_context_id=parent_context_id,
            parent_len=parent_len,
            parent_timeout_ms=parent_timeout_ms,
            token_ids=token_ids,
            text=text,
            priority=priority,
            checkpoints=_checkpoints(checkpoints),
        )
        return msgspec.json.decode(await self._post("/fill", body), type=FillResponse)

    @staticmethod
    def _generate_body(context_id, sampling, parent_context_id, **kw) -> GenerateRequest:
        return GenerateRequest(
            context_id=context_id,
            parent_context_id=parent_context_id,
            sampling=sampling,
            parent_len=kw.get("parent_len"),
            parent_timeout_ms=kw.get("parent_timeout_ms", 0),
            token_ids=kw.get("token_ids"),
            text=kw.get("text"),
            priority=kw.get("priority", 0),
            checkpoints=_checkpoints(kw.get("checkpoints", ())),
            stream_interval_ms=kw.get("stream_interval_ms", 0),
        )

    async def generate(self, context_id, sampling, parent_context_id=None, **kw) -> GenerateResponse:
        body = self._generate_body(context_id, sampling, parent_context_id, **kw)
        return msgspec.json.decode(await self._post("/generate", body), type=GenerateResponse)

    async def generate_stream(self, context_id, sampling, parent_context_id=None, **kw):
        body = self._generate_body(context_id, sampling, parent_context_id, **kw)
        try:
            async with self._client.stream(
                "POST",
                "/generate_stream",
                content=msgspec.json.encode(body),
                headers={"content-type": "application/json"},
            ) as r:
                if r.status_code >= 400:
                    raise _engine_error(r.status_code, await r.aread(), self.public_url)
                end = None
                async for event in EventSource(r).aiter_sse():
                    if event.event == "error":  # the job failed after its first token
                        error = msgspec.json.decode(event.data)
                        raise error_for(error["status"], error["code"], error["message"])
                    if event.event == "end":
                        # Read on to the response's end (it ends here): a response left
                        # unread closes its connection, and the next request opens one.
                        end = msgspec.json.decode(event.data, type=StreamEnd)
                        continue
                    yield msgspec.json.decode(event.data, type=TokenStreamEvent)
            if end is not None:
                yield end
        except SSEError as error:
            raise EngineUnavailableError(f"engine {self.public_url} sent no event stream: {error}") from None
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"engine {self.public_url} unreachable: {error!r}") from error

    async def abort(self, context_ids: list[int]) -> AbortResponse:
        raw = await self._post("/abort", AbortRequest(context_ids=list(context_ids)))
        return msgspec.json.decode(raw, type=AbortResponse)

    async def abort_range(self, start: int, end: int) -> AbortResponse:
        """Free every context with ``start <= id < end`` (what a dead run left)."""
        raw = await self._post("/abort_range", AbortRangeRequest(start=start, end=end))
        return msgspec.json.decode(raw, type=AbortResponse)

    async def free_context(self, context_id: int) -> int:
        raw = await self._post("/free_context", FreeContextRequest(context_id=context_id))
        return msgspec.json.decode(raw, type=FreeContextResponse).freed_tokens

    async def tokenize(self, text: str) -> list[int]:
        raw = await self._post("/tokenize", TokenizeRequest(text=text))
        return msgspec.json.decode(raw, type=TokenizeResponse).token_ids

    async def tokenizer_json(self) -> str | None:
        """The engine's ``tokenizer.json`` (None when it has none)."""
        try:
            r = await self._client.get("/tokenizer")
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"engine {self.public_url} unreachable: {error!r}") from error
        return r.text if r.status_code == 200 else None

    async def render_chat(self, chat: RenderChatRequest) -> RenderChatResponse:
        raw = await self._post("/render_chat", chat)
        return msgspec.json.decode(raw, type=RenderChatResponse)

    async def ping(self, timeout_s: float | None = None) -> dict:
        try:
            r = await self._client.get("/ping", timeout=timeout_s or self.ping_timeout_s)
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"engine {self.public_url} unreachable: {error!r}") from error
        if r.status_code >= 400:
            raise _engine_error(r.status_code, r.content, self.public_url)
        return r.json()

    async def aclose(self) -> None:
        await self._client.aclose()


def _engine_error(status: int, content: bytes, url: str) -> ParrotError:
    try:
        error = json.loads(content)["error"]
        return error_for(status, error["code"], error["message"])
    except (ValueError, KeyError, TypeError):
        return EngineUnavailableError(f"engine {url} answered {status} without an error body")
