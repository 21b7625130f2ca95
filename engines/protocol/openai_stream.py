"""OpenAI-compatible responses from generation events, shared by every server that speaks
the OpenAI API (the builtin engine and the ServeCore's front).

A server turns its own events into :class:`Delta` (text of choice ``index``) and
:class:`Finish` (choice ``index`` is done); these functions build the JSON responses and
the server-sent-event streams, so the wire shapes live in one place.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from parrot.engines.protocol.errors import BadRequestError
from parrot.wire.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionResponse,
    PromptTokensDetails,
    Usage,
)
from parrot.wire.sampling import SamplingParams


@dataclass(frozen=True)
class Delta:
    index: int
    text: str


@dataclass(frozen=True)
class Finish:
    index: int
    finish_reason: str
    completion_tokens: int


@dataclass(frozen=True)
class Answer:
    """One finished choice of a non-streaming request."""

    text: str
    finish_reason: str
    completion_tokens: int


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def sampling_params(req, default_max_tokens: int) -> SamplingParams:
    """The sampling of an OpenAI completion or chat request."""
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens or default_max_tokens
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    fields = {
        "max_tokens": max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": max(0, req.top_k),
        "seed": req.seed,
        "stop": stop,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty,
        "ignore_eos": req.ignore_eos,
    }
    return msgspec.convert(fields, SamplingParams)


def content_text(content: str | list[dict] | None) -> str:
    """The text of a chat message's content (a string or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise BadRequestError(f"only text message parts are supported, got {part.get('type')!r}")
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def completion_response(
    rid: str, created: int, model: str, answers: list[Answer], use: Usage
) -> CompletionResponse:
    choices = [
        CompletionChoice(index=i, text=a.text, finish_reason=a.finish_reason) for i, a in enumerate(answers)
    ]
    return CompletionResponse(id=rid, created=created, model=model, choices=choices, usage=use)


def chat_response(
    rid: str, created: int, model: str, answers: list[Answer], use: Usage
) -> ChatCompletionResponse:
    choices = [
        ChatChoice(index=i, message=AssistantMessage(content=a.text), finish_reason=a.finish_reason)
        for i, a in enumerate(answers)
    ]
    return ChatCompletionResponse(id=rid, created=created, model=model, choices=choices, usage=use)


def sse(payload: msgspec.Struct | str) -> ServerSentEventMessage:
    """One event as OpenAI sends it: ``data: <json>`` and a blank line, ``\n``-separated."""
    body = payload if isinstance(payload, str) else msgspec.json.encode(payload).decode()
    return ServerSentEventMessage(data=body, sep="\n")


async def completion_stream(
    events: AsyncIterator[Delta | Finish],
    rid: str,
    created: int,
    model: str,
    final_usage: Callable[[int], Usage] | None,
) -> AsyncIterator[ServerSentEventMessage]:
    """``text_completion`` chunks, then (with ``final_usage``) a usage chunk, then [DONE]."""
    completion_tokens = 0
    async for event in events:
        if isinstance(event, Finish):
            completion_tokens += event.completion_tokens
            choice = CompletionChoice(index=event.index, text="", finish_reason=event.finish_reason)
        elif event.text:
            choice = CompletionChoice(index=event.index, text=event.text, finish_reason=None)
        else:
            continue
        yield sse(CompletionResponse(id=rid, created=created, model=model, choices=[choice]))
    if final_usage is not None:
        yield sse(
            CompletionResponse(
                id=rid, created=created, model=model, choices=[], usage=final_usage(completion_tokens)
            )
        )
    yield sse("[DONE]")


async def chat_stream(
    events: AsyncIterator[Delta | Finish],
    n: int,
    rid: str,
    created: int,
    model: str,
    final_usage: Callable[[int], Usage] | None,
) -> AsyncIterator[ServerSentEventMessage]:
    """``chat.completion.chunk`` s: the role of each choice, the text deltas, the finish of
    each, then (with ``final_usage``) a usage chunk, then [DONE]."""

    def chunk(choices: list[ChatChunkChoice], use: Usage | None = None) -> ServerSentEventMessage:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=choices, usage=use))

    for i in range(n):
        yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
    completion_tokens = 0
    async for event in events:
        if isinstance(event, Finish):
            completion_tokens += event.completion_tokens
            yield chunk(
                [ChatChunkChoice(index=event.index, delta=ChatDelta(), finish_reason=event.finish_reason)]
            )
        elif event.text:
            yield chunk([ChatChunkChoice(index=event.index, delta=ChatDelta(content=event.text))])
    if final_usage is not None:
        yield chunk([], final_usage(completion_tokens))
    yield sse("[DONE]")


class EventStream(ServerSentEvent):
    """Litestar's ``ServerSentEvent`` for a route that answers JSON or a stream: Litestar
    gives a returned stream the media type of its handler (JSON there); this one keeps
    ``text/event-stream``, so clients that check the content type (httpx-sse) accept it."""

    def to_asgi_response(self, *args, **kwargs):
        return super().to_asgi_response(*args, **{**kwargs, "media_type": self.media_type})
