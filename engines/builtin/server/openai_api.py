"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` on the builtin engine.

Each request runs in an engine-internal context (negative ids, so they never collide with
the ids a ServeCore chooses) that is freed afterwards. Prompt blocks are content-addressed
in the engine's prefix cache, so a repeated prefix (a system prompt) is computed once and
reported as ``usage.prompt_tokens_details.cached_tokens``. ``n > 1`` forks the prompt
context instead of filling it n times.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from litestar import Controller, Request, get, post
from litestar.params import JSONBody
from litestar.response import Stream

from parrot.engines.builtin import text_work
from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.server.deps import OPENAI, EngineDep, OpenAIContextIds, OpenAIIds
from parrot.engines.protocol.disconnect import unless_disconnected
from parrot.engines.protocol.error_docs import BODY, error_responses
from parrot.engines.protocol.errors import BadRequestError
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
    usage,
)
from parrot.engines.protocol.schemas import GenerateResponse, StreamEnd, TokenStreamEvent
from parrot.engines.protocol.stream_docs import JsonOrEventStream
from parrot.wire.openai_schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    Usage,
)
from parrot.wire.sampling import SamplingParams
from parrot.wire.tool_calls import ToolPlan
from parrot.wire.tool_syntax import GENERIC, ToolSyntax, syntax_of_template


def _sampling(
    req,
    prompt_len: int,
    max_model_len: int,
    default_max: int | None,
    tools: ToolPlan | None = None,
    syntax: ToolSyntax = GENERIC,
) -> SamplingParams:
    """Without a max_tokens, chat generates up to the end of the model's context."""
    return sampling_params(req, default_max or max(1, max_model_len - prompt_len), tools, syntax)


def tool_syntax(engine: BuiltinEngine) -> ToolSyntax:
    """The syntax this engine's model writes tool calls in (its template's, or Parrot's)."""
    return syntax_of_template(engine.tokenizer.chat_template, engine.config.tool_format)


def _check_model(engine: BuiltinEngine, model: str | None) -> None:
    if model and model != engine.model_name:
        raise BadRequestError(f"model {model!r} is not served here; this engine serves {engine.model_name!r}")


class _Run:
    """One OpenAI request: a prompt context, ``n`` generations, then everything freed."""

    def __init__(
        self,
        engine: BuiltinEngine,
        ids: OpenAIContextIds,
        tokens: list[int],
        sampling: SamplingParams,
        n: int,
    ):
        self.engine = engine
        self.tokens = tokens
        self.sampling = sampling
        self.n = n
        self.prompt_id = ids.next()
        self.child_ids = [ids.next() for _ in range(n)] if n > 1 else [self.prompt_id]
        self.cached_tokens = 0

    async def fill(self) -> None:
        result = await self.engine.fill(self.prompt_id, self.tokens)
        self.cached_tokens = result.cached_tokens

    def parent(self) -> int | None:
        return self.prompt_id if self.n > 1 else None

    async def free(self) -> None:
        for cid in {self.prompt_id, *self.child_ids}:
            await self.engine.free_context(cid)

    def usage(self, completion_tokens: int) -> Usage:
        return usage(len(self.tokens), completion_tokens, self.cached_tokens)

    def prompt_in_job(self) -> list[int]:
        """With one choice, the generate job fills the prompt itself: its first token comes in
        the prompt's own step, not in a step after a separate fill job's answer."""
        return self.tokens if self.n == 1 else []

    async def generate_all(self) -> list[GenerateResponse]:
        prompt = self.prompt_in_job()
        if not prompt:
            await self.fill()
        results = await asyncio.gather(
            *(
                self.engine.generate(cid, self.sampling, self.parent(), token_ids=prompt)
                for cid in self.child_ids
            )
        )
        if prompt:
            self.cached_tokens = results[0].cached_tokens
        return list(results)

    async def stream_all(self) -> AsyncIterator[tuple[int, TokenStreamEvent | StreamEnd]]:
        """Merged events of all n generations, tagged with their choice index."""
        prompt = self.prompt_in_job()
        if not prompt:
            await self.fill()
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, cid: int) -> None:
            try:
                events = self.engine.generate_stream(cid, self.sampling, self.parent(), token_ids=prompt)
                async for event in events:
                    await queue.put((index, event))
            except BaseException as error:
                await queue.put((index, error))

        tasks = [asyncio.create_task(pump(i, cid)) for i, cid in enumerate(self.child_ids)]
        try:
            done = 0
            while done < self.n:
                index, event = await queue.get()
                if isinstance(event, BaseException):
                    raise event
                if isinstance(event, StreamEnd):
                    done += 1
                    if prompt:
                        self.cached_tokens = event.cached_tokens
                yield index, event
        finally:
            for task in tasks:
                task.cancel()

    async def deltas(self, first: tuple, events: AsyncIterator[tuple]) -> AsyncIterator[Delta | Finish]:
        """The merged stream as shared OpenAI events; frees the contexts at its end."""
        try:
            event: tuple | None = first
            while event is not None:
                index, item = event
                if isinstance(item, StreamEnd):
                    yield Finish(index, item.finish_reason, len(item.token_ids))
                else:
                    yield Delta(index, item.text)
                event = await anext(events, None)
        finally:
            await events.aclose()
            await self.free()

    async def answers(self) -> list[Answer]:
        try:
            results = await self.generate_all()
        finally:
            await self.free()
        return [Answer(r.text, r.finish_reason, len(r.token_ids)) for r in results]


class OpenAIAPI(Controller):
    """OpenAI's completions, chat completions and model list, on this engine's model."""

    path = "/v1"
    dependencies = OPENAI

    @post(
        "/completions",
        status_code=200,
        responses=error_responses(BODY, 409, 503),
        operation_class=JsonOrEventStream,
    )
    async def completions(
        self,
        data: JSONBody[CompletionRequest],
        engine: EngineDep,
        ids: OpenAIIds,
        request: Request,
    ) -> CompletionResponse | Stream:
        _check_model(engine, data.model)
        if data.echo or data.logprobs:
            raise BadRequestError("echo and logprobs are not supported")
        tokens = await _prompt_token_ids(engine, data.prompt)
        sampling = _sampling(data, len(tokens), engine.core.max_model_len, default_max=16)
        run = _Run(engine, ids, tokens, sampling, data.n)
        rid, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), engine.model_name
        if not data.stream:
            # A client that gives up stops the generation (its contexts are freed).
            answers = await unless_disconnected(request, run.answers())
            return completion_response(
                rid, created, model, answers, run.usage(sum(a.completion_tokens for a in answers))
            )
        events = run.stream_all()
        first = await anext(events)  # errors before the first token still get a 4xx
        final_usage = run.usage if data.stream_options and data.stream_options.include_usage else None
        body = completion_stream(run.deltas(first, events), rid, created, model, final_usage)
        return EventStream(ending_with_errors(body))

    @post(
        "/chat/completions",
        status_code=200,
        responses=error_responses(BODY, 409, 503),
        operation_class=JsonOrEventStream,
    )
    async def chat_completions(
        self,
        data: JSONBody[ChatCompletionRequest],
        engine: EngineDep,
        ids: OpenAIIds,
        request: Request,
    ) -> ChatCompletionResponse | Stream:
        _check_model(engine, data.model)
        if data.logprobs:
            raise BadRequestError("logprobs are not supported")
        chat = read_chat(data)
        syntax = tool_syntax(engine)
        text = await text_work.chat_prompt(engine.tokenizer, chat.render(syntax))
        tokens = await text_work.tokenize(engine.tokenizer, text)
        sampling = _sampling(data, len(tokens), engine.core.max_model_len, None, chat.tools, syntax)
        run = _Run(engine, ids, tokens, sampling, data.n)
        rid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), engine.model_name
        tools = syntax.bound(chat.tools) if chat.tools is not None else None
        if not data.stream:
            # A client that gives up stops the generation (its contexts are freed).
            answers = await unless_disconnected(request, run.answers())
            use = run.usage(sum(a.completion_tokens for a in answers))
            return chat_response(rid, created, model, answers, use, tools=tools)
        events = run.stream_all()
        first = await anext(events)
        final_usage = run.usage if data.stream_options and data.stream_options.include_usage else None
        body = chat_stream(run.deltas(first, events), data.n, rid, created, model, final_usage, tools)
        return EventStream(ending_with_errors(body))

    @get("/models")
    async def models(self, engine: EngineDep) -> ModelList:
        return ModelList(data=[ModelCard(id=engine.model_name, created=0)])


async def _prompt_token_ids(engine: BuiltinEngine, prompt: str | list[int | str]) -> list[int]:
    """A prompt string, a one-element list of strings, or a list of token ids."""
    if isinstance(prompt, list) and any(isinstance(p, str) for p in prompt):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise BadRequestError("send one prompt per request: a string or a list of token ids")
        prompt = prompt[0]
    tokens = await text_work.tokenize(engine.tokenizer, prompt) if isinstance(prompt, str) else list(prompt)
    if not tokens:
        raise BadRequestError("the prompt is empty")
    return tokens
