"""How the ServeCore talks to an engine: the ``Engine`` protocol and its HTTP client.

A remote builtin engine and an in-process OpenAI engine are used the same way.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import aiohttp
import msgspec

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
    """A builtin engine (``parrot engine``) reached over HTTP.

    On aiohttp rather than httpx: every call of the ServeCore is a streamed generation
    here, and aiohttp (its HTTP parser in C) took 1.2 ms of CPU for a generation and its
    abort where httpx and httpx-sse took 3.0 (100 of each, alternating, against a tiny
    engine; docs/benchmarks.md): the ServeCore shares its cores with the engines."""

    def __init__(self, base_url: str, timeout_s: float = 600.0, ping_timeout_s: float = 2.0) -> None:
        self.public_url = public_url(base_url)  # for messages: without credentials
        # Credentials in the URL (an engine behind a proxy with Basic auth) go to the client
        # as its auth, so they are in no URL it logs.
        self.base_url, credentials = split_credentials(base_url.rstrip("/"))
        self._headers = {"Authorization": _basic_auth(*credentials)} if credentials else None
        self.ping_timeout_s = ping_timeout_s
        # Generations may take long: a hung engine is found by its pings, not by this timeout
        # (it bounds connecting and each wait for data, as httpx's did).
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None  # made on the event loop that uses it

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=2048, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, headers=self._headers
            )
        return self._session

    def _unreachable(self, error: BaseException) -> EngineUnavailableError:
        return EngineUnavailableError(f"engine {self.public_url} unreachable: {error!r}")

    async def _post(self, path: str, body: msgspec.Struct) -> bytes:
        try:
            data = msgspec.json.encode(body)
            async with self._http().post(self.base_url + path, data=data, headers=_JSON) as r:
                content = await r.read()
        except _TRANSPORT_ERRORS as error:
            raise self._unreachable(error) from error
        if r.status >= 400:
            raise _engine_error(r.status, content, self.public_url)
        return content

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
            async with self._http().post(
                self.base_url + "/generate_stream", data=msgspec.json.encode(body), headers=_JSON
            ) as r:
                if r.status >= 400:
                    raise _engine_error(r.status, await r.read(), self.public_url)
                if r.content_type != "text/event-stream":
                    kind = r.content_type or "no content type"
                    raise EngineUnavailableError(f"engine {self.public_url} sent no event stream ({kind})")
                end = None
                async for name, data in _events(r.content):
                    if name == "error":  # the job failed after its first token
                        error = msgspec.json.decode(data)
                        raise error_for(error["status"], error["code"], error["message"])
                    if name == "end":
                        # Read on to the response's end (it ends here): a response left
                        # unread closes its connection, and the next request opens one.
                        end = msgspec.json.decode(data, type=StreamEnd)
                        continue
                    yield msgspec.json.decode(data, type=TokenStreamEvent)
            if end is not None:
                yield end
        except _TRANSPORT_ERRORS as error:
            raise self._unreachable(error) from error

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
            async with self._http().get(self.base_url + "/tokenizer") as r:
                return await r.text() if r.status == 200 else None
        except _TRANSPORT_ERRORS as error:
            raise self._unreachable(error) from error

    async def render_chat(self, chat: RenderChatRequest) -> RenderChatResponse:
        raw = await self._post("/render_chat", chat)
        return msgspec.json.decode(raw, type=RenderChatResponse)

    async def ping(self, timeout_s: float | None = None) -> dict:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.ping_timeout_s)
        try:
            async with self._http().get(self.base_url + "/ping", timeout=timeout) as r:
                content = await r.read()
        except _TRANSPORT_ERRORS as error:
            raise self._unreachable(error) from error
        if r.status >= 400:
            raise _engine_error(r.status, content, self.public_url)
        return json.loads(content)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


_JSON = {"content-type": "application/json"}


def _basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# A refused or lost connection, or a timeout (aiohttp's timeouts are asyncio's TimeoutError).
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


async def _events(body: aiohttp.StreamReader) -> AsyncIterator[tuple[str, bytes]]:
    """(event name, data) of a server-sent event stream as the engine writes it
    (engines/protocol/event_stream.py): ``event:`` and ``data:`` lines, a blank line after
    each event; an unnamed event is ``message``, data lines are joined by newlines. Lines
    are split here, from chunks as they come: aiohttp's line reader refuses a line over
    64 KiB, and a long output's last event is longer."""
    name, data, rest = "message", [], b""
    async for chunk in body.iter_any():
        *lines, rest = (rest + chunk).split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r")
            if not line:
                if data:
                    yield name, b"\n".join(data)
                name, data = "message", []
            elif line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"event:"):
                name = line[6:].strip().decode()
    if data:
        yield name, b"\n".join(data)


def _engine_error(status: int, content: bytes, url: str) -> ParrotError:
    try:
        error = json.loads(content)["error"]
        return error_for(status, error["code"], error["message"])
    except (ValueError, KeyError, TypeError):
        return EngineUnavailableError(f"engine {url} answered {status} without an error body")
