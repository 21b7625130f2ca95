"""How the ServeCore talks to an engine: the ``Engine`` protocol and its HTTP client.

A remote builtin engine and (later) an in-process OpenAI engine are used the same way.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Protocol

import httpx
import msgspec

from parrot.engines.protocol.errors import EngineUnavailableError, ParrotError, error_from_response
from parrot.engines.protocol.sampling import SamplingParams
from parrot.engines.protocol.schemas import (
    ChatTurn,
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


class Engine(Protocol):
    async def fill(
        self,
        context_id: int,
        token_ids: list[int] | None = None,
        text: str | None = None,
        parent_context_id: int | None = None,
    ) -> FillResponse: ...

    async def generate(
        self, context_id: int, sampling: SamplingParams, parent_context_id: int | None = None
    ) -> GenerateResponse: ...

    def generate_stream(
        self, context_id: int, sampling: SamplingParams, parent_context_id: int | None = None
    ) -> AsyncIterator[TokenStreamEvent | StreamEnd]: ...

    async def free_context(self, context_id: int) -> int: ...

    async def ping(self) -> dict: ...

    async def aclose(self) -> None: ...


class HttpEngine:
    """A builtin engine (``parrot engine``) reached over HTTP."""

    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s)

    async def _post(self, path: str, body: msgspec.Struct) -> bytes:
        try:
            r = await self._client.post(
                path, content=msgspec.json.encode(body), headers={"content-type": "application/json"}
            )
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"engine {self.base_url} unreachable: {error!r}") from error
        if r.status_code >= 400:
            raise _engine_error(r.status_code, r.content, self.base_url)
        return r.content

    async def fill(self, context_id, token_ids=None, text=None, parent_context_id=None) -> FillResponse:
        body = FillRequest(
            context_id=context_id, parent_context_id=parent_context_id, token_ids=token_ids, text=text
        )
        return msgspec.json.decode(await self._post("/fill", body), type=FillResponse)

    async def generate(self, context_id, sampling, parent_context_id=None) -> GenerateResponse:
        body = GenerateRequest(context_id=context_id, parent_context_id=parent_context_id, sampling=sampling)
        return msgspec.json.decode(await self._post("/generate", body), type=GenerateResponse)

    async def generate_stream(self, context_id, sampling, parent_context_id=None):
        body = GenerateRequest(context_id=context_id, parent_context_id=parent_context_id, sampling=sampling)
        try:
            async with self._client.stream(
                "POST",
                "/generate_stream",
                content=msgspec.json.encode(body),
                headers={"content-type": "application/json"},
            ) as r:
                if r.status_code >= 400:
                    raise _engine_error(r.status_code, await r.aread(), self.base_url)
                kind = None
                async for line in r.aiter_lines():
                    if line.startswith("event:"):
                        kind = line.split(":", 1)[1].strip()
                    elif line.startswith("data:"):
                        data = line.split(":", 1)[1].strip()
                        if kind == "end":
                            yield msgspec.json.decode(data, type=StreamEnd)
                            return
                        yield msgspec.json.decode(data, type=TokenStreamEvent)
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"engine {self.base_url} unreachable: {error!r}") from error

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
            raise EngineUnavailableError(f"engine {self.base_url} unreachable: {error!r}") from error
        return r.text if r.status_code == 200 else None

    async def render_chat(self, messages: list[ChatTurn]) -> list[str]:
        raw = await self._post("/render_chat", RenderChatRequest(messages=messages))
        return msgspec.json.decode(raw, type=RenderChatResponse).pieces

    async def ping(self) -> dict:
        try:
            r = await self._client.get("/ping")
        except httpx.TransportError as error:
            raise EngineUnavailableError(f"engine {self.base_url} unreachable: {error!r}") from error
        if r.status_code >= 400:
            raise _engine_error(r.status_code, r.content, self.base_url)
        return r.json()

    async def aclose(self) -> None:
        await self._client.aclose()


def _engine_error(status: int, content: bytes, url: str) -> ParrotError:
    try:
        error = json.loads(content)["error"]
        return error_from_response(status, error["code"], error["message"])
    except (ValueError, KeyError, TypeError):
        return EngineUnavailableError(f"engine {url} answered {status} without an error body")
