"""The OpenAI-compatible API of the ServeCore: ``/v1/completions``, ``/v1/chat/completions``
(plain and streaming, with ``usage``) and ``/v1/models``.

Existing OpenAI clients (the ``openai`` package, LangChain's ``ChatOpenAI``) get Parrot's
scheduling and prefix sharing without changes: each request runs as a one-call session
(:mod:`parrot.platform.serve.sessions.oneshot`), its prompt split into constant pieces at message
boundaries, so a system prompt shared by many requests is one context per engine. API
keys for this front are optional (``--openai-api-key``); without any, it is open.

Each request is traced from its start (:mod:`.front_records`): whatever ends it (an answer, a
refusal, an error, its client leaving) leaves its record for operators (``/requests``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from litestar import Controller, Request, get, post
from litestar.params import JSONBody
from litestar.response import Stream

from parrot.engines.protocol.access_log import record_tokens
from parrot.engines.protocol.disconnect import unless_disconnected
from parrot.engines.protocol.error_docs import ADMIN, BODY, CREATES, error_responses
from parrot.engines.protocol.errors import BadRequestError, EngineLoadingError, NotFoundError
from parrot.engines.protocol.event_stream import EventStream
from parrot.engines.protocol.openai_requests import read_chat, sampling_params
from parrot.engines.protocol.openai_stream import (
    Answer,
    Delta,
    Finish,
    chat_response,
    chat_stream,
    completion_response,
    completion_stream,
    ending_with_errors,
)
from parrot.engines.protocol.schemas import RenderChatRequest
from parrot.engines.protocol.stream_docs import JsonOrEventStream
from parrot.platform.api.auth import openai_key_guard
from parrot.platform.api.deps import Core
from parrot.platform.api.front_records import request_facts
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.sessions.oneshot import OneShot, render_chat
from parrot.wire.openai_schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    Usage,
)

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_MAX_TOKENS = 512  # without max_tokens a chat answer stops here (or at end of sequence)


def _model(core: ServeCore, asked: str | None) -> str:
    served = core.engines.models()
    if not served:
        if core.engines.loading.stage is not None:
            raise EngineLoadingError(core.engines.loading.describe())
        raise NotFoundError("no engine is registered")
    if asked is None:
        return served[0]
    if asked not in served:
        raise NotFoundError(f"model {asked!r} is not served here; GET /v1/models lists {served}")
    return asked


def _prompt(prompt: str | list) -> str:
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise BadRequestError(
                "send one prompt per request, as a string (token ids are not supported here)"
            )
        prompt = prompt[0]
    if not prompt:
        raise BadRequestError("the prompt is empty")
    return prompt


def _final_usage(data, run: OneShot):
    return run.usage if data.stream_options and data.stream_options.include_usage else None


async def _started(request: Request, run: OneShot) -> AsyncIterator[Delta | Finish]:
    """The run's events once the first has come, so a failure before the first token (an
    engine that refuses the request's output format) is an HTTP error, not a broken
    stream; a client that gives up while it waits stops the run."""
    events = run.events()
    first = await unless_disconnected(request, anext(events))

    async def chained() -> AsyncIterator[Delta | Finish]:
        completion = first.completion_tokens if isinstance(first, Finish) else 0  # (the access line)
        try:
            yield first
            async for event in events:
                if isinstance(event, Finish):
                    completion += event.completion_tokens
                yield event
        finally:
            await events.aclose()
            record_tokens(request.state, run.usage(completion).prompt_tokens, completion)

    return chained()


async def _finished(request: Request, run: OneShot) -> tuple[list[Answer], Usage]:
    """The answers of a run that does not stream, and their usage. A client that gives up
    stops the generation (its session is closed)."""
    answers = await unless_disconnected(request, run.answers())
    use = run.usage(sum(a.completion_tokens for a in answers))
    record_tokens(request.state, use.prompt_tokens, use.completion_tokens)
    return answers, use


# What the two generation routes share: one answer, or an event stream.
_GENERATION = dict(
    status_code=200,
    responses=error_responses(BODY, ADMIN, 404, CREATES, 503),
    operation_class=JsonOrEventStream,
)


class OpenAIController(Controller):
    """The OpenAI-compatible routes, behind the front's API keys (when any is configured)."""

    path = "/v1"
    guards = (openai_key_guard,)

    @post("/completions", **_GENERATION)
    async def completions(
        self, data: JSONBody[CompletionRequest], core: Core, request: Request
    ) -> CompletionResponse | Stream:
        if data.echo or data.logprobs:
            raise BadRequestError("echo and logprobs are not supported")
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        trace = core.requests.trace(request_facts(rid, data, request.headers))
        with trace.watch():
            model = _model(core, data.model)
            sampling = sampling_params(data, COMPLETION_MAX_TOKENS)
            prompt = [_prompt(data.prompt)]
            run = await OneShot.start(core, prompt, sampling, data.n, model, bool(data.stream), trace)
            if not data.stream:
                return completion_response(rid, created, model, *await _finished(request, run))
            events = await _started(request, run)
        body = completion_stream(events, rid, created, model, _final_usage(data, run))
        return EventStream(ending_with_errors(body))

    @post("/chat/completions", **_GENERATION)
    async def chat_completions(
        self, data: JSONBody[ChatCompletionRequest], core: Core, request: Request
    ) -> ChatCompletionResponse | Stream:
        if data.logprobs:
            raise BadRequestError("logprobs are not supported")
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        trace = core.requests.trace(request_facts(rid, data, request.headers))
        with trace.watch():
            model = _model(core, data.model)
            chat = read_chat(data)
            asked = RenderChatRequest(
                messages=chat.turns,
                tools=data.tools,
                tool_choice=data.tool_choice,
                parallel_tool_calls=data.parallel_tool_calls,
            )
            pieces, syntax = await render_chat(core, model, asked, chat.tools)
            sampling = sampling_params(data, CHAT_MAX_TOKENS, chat.tools, syntax)
            tools = syntax if chat.tools is not None else None
            trace.read_tools_with(tools)
            run = await OneShot.start(core, pieces, sampling, data.n, model, bool(data.stream), trace)
            if not data.stream:
                return chat_response(rid, created, model, *await _finished(request, run), tools=tools)
            events = await _started(request, run)
        body = chat_stream(events, data.n, rid, created, model, _final_usage(data, run), tools)
        return EventStream(ending_with_errors(body))

    @get("/models", responses=error_responses(ADMIN))
    async def models(self, core: Core) -> ModelList:
        return ModelList(data=[ModelCard(id=m, created=0) for m in core.engines.models()])
