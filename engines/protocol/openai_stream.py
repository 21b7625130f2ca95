"""OpenAI-compatible responses from generation events, shared by every server that speaks
the OpenAI API (the builtin engine and the ServeCore's front).

A server turns its own events into :class:`Delta` (text of choice ``index``) and
:class:`Finish` (choice ``index`` is done); these functions build the JSON responses and
the server-sent-event streams, so the wire shapes live in one place.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import msgspec
from litestar.response.sse import ServerSentEventMessage

from parrot.wire.errors import ParrotError
from parrot.wire.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionResponse,
    FunctionCallDelta,
    PromptTokensDetails,
    ToolCallDelta,
    Usage,
)
from parrot.wire.tool_calls import ToolAnswer
from parrot.wire.tool_syntax import ToolSyntax


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


def completion_response(
    rid: str, created: int, model: str, answers: list[Answer], use: Usage
) -> CompletionResponse:
    choices = [
        CompletionChoice(index=i, text=a.text, finish_reason=a.finish_reason) for i, a in enumerate(answers)
    ]
    return CompletionResponse(id=rid, created=created, model=model, choices=choices, usage=use)


def chat_message(answer: Answer, tools: ToolSyntax | None) -> tuple[AssistantMessage, str]:
    """The message and finish reason of a chat answer. With ``tools`` (the tool syntax the
    answer is in), it is read as its stream would be: its calls (``finish_reason:
    "tool_calls"`` once the list is complete; the whole ones of a list cut by
    ``max_tokens``, with ``length``) and any text before them, or its text."""
    if tools is None:
        return AssistantMessage(content=answer.text), answer.finish_reason
    parsed, called = tools.read(answer.text)
    if parsed.tool_calls:
        reason = "tool_calls" if called else answer.finish_reason
        return AssistantMessage(content=parsed.content, tool_calls=list(parsed.tool_calls)), reason
    return AssistantMessage(content=parsed.content), answer.finish_reason


def chat_response(
    rid: str, created: int, model: str, answers: list[Answer], use: Usage, tools: ToolSyntax | None = None
) -> ChatCompletionResponse:
    choices = []
    for index, answer in enumerate(answers):
        message, finish_reason = chat_message(answer, tools)
        choices.append(ChatChoice(index=index, message=message, finish_reason=finish_reason))
    return ChatCompletionResponse(id=rid, created=created, model=model, choices=choices, usage=use)


def sse(payload: msgspec.Struct | str) -> ServerSentEventMessage:
    """One event as OpenAI sends it: ``data: <json>`` and a blank line, ``\n``-separated."""
    body = payload if isinstance(payload, str) else msgspec.json.encode(payload).decode()
    return ServerSentEventMessage(data=body, sep="\n")


async def ending_with_errors(
    chunks: AsyncIterator[ServerSentEventMessage],
) -> AsyncIterator[ServerSentEventMessage]:
    """A stream that fails after it began ends as OpenAI's do: a data event ``{"error":
    {...}}`` (its clients raise it as an ``APIError``) instead of a cut connection."""
    try:
        async for chunk in chunks:
            yield chunk
    except ParrotError as error:
        body = {"message": str(error), "type": error.code, "code": error.code, "status": error.status_code}
        yield sse(msgspec.json.encode({"error": body}).decode())


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
    tools: ToolSyntax | None = None,
) -> AsyncIterator[ServerSentEventMessage]:
    """``chat.completion.chunk`` s: the role of each choice, the text deltas, the finish of
    each, then (with ``final_usage``) a usage chunk, then [DONE]. With ``tools`` (the tool
    syntax the answers are in), each choice's text is read as a tool answer (its
    ``reader``): text streams as content, tool calls come as ``tool_calls`` deltas when
    they are complete."""

    def chunk(choices: list[ChatChunkChoice], use: Usage | None = None) -> ServerSentEventMessage:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=choices, usage=use))

    def content(index: int, text: str) -> ServerSentEventMessage:
        return chunk([ChatChunkChoice(index=index, delta=ChatDelta(content=text))])

    for i in range(n):
        yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
    answers = [tools.reader() for _ in range(n)] if tools is not None else None

    def given(index: int, answer: ToolAnswer) -> Iterator[ServerSentEventMessage]:
        """Chunks of what a choice's answer gives now: content, then each call whole."""
        if answer.content:
            yield content(index, answer.content)
        for call in answer.tool_calls:
            function = FunctionCallDelta(name=call.function.name, arguments=call.function.arguments)
            number = answers[index].given_calls
            answers[index].given_calls += 1
            delta = ToolCallDelta(index=number, id=call.id, type="function", function=function)
            yield chunk([ChatChunkChoice(index=index, delta=ChatDelta(tool_calls=[delta]))])

    completion_tokens = 0
    async for event in events:
        if isinstance(event, Finish):
            completion_tokens += event.completion_tokens
            finish_reason = event.finish_reason
            if answers is not None:
                for message in given(event.index, answers[event.index].finish()):
                    yield message
                if answers[event.index].called_tools:
                    finish_reason = "tool_calls"
            yield chunk([ChatChunkChoice(index=event.index, delta=ChatDelta(), finish_reason=finish_reason)])
        elif event.text and answers is not None:
            for message in given(event.index, answers[event.index].feed(event.text)):
                yield message
        elif event.text:
            yield content(event.index, event.text)
    if final_usage is not None:
        yield chunk([], final_usage(completion_tokens))
    yield sse("[DONE]")
