"""One OpenAI-style request as a one-call session on the ServeCore.

The OpenAI front (``/v1/completions``, ``/v1/chat/completions``) runs each request as a
session of its own that is never stored: ``n`` latency-critical generations after the same
text pieces. The pieces (a chat's messages) are constant text: their boundaries are
prefixes kept as contexts shared by every request, so the system prompt (and any shared
chat history) of many requests is held once per engine, and the scheduler sees these
requests next to the DAGs of Parrot sessions. A run given the request's trace ends it
(:mod:`parrot.platform.serve.ops.requests`): its answer, failure or cancellation is what
operators see of the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, nullcontext

import msgspec

from parrot.engines.protocol.openai_stream import Answer, Delta, Finish, usage
from parrot.engines.protocol.schemas import RenderChatRequest
from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.ops.requests import RequestStatus, RequestTrace
from parrot.platform.serve.sessions.session import Session
from parrot.wire.errors import BadEngineAnswerError
from parrot.wire.openai_schemas import Usage
from parrot.wire.sampling import SamplingParams
from parrot.wire.tool_calls import ToolPlan
from parrot.wire.tool_syntax import GENERIC, SYNTAXES, ToolSyntax

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"


def chatml_pieces(messages: list[dict]) -> list[str]:
    """The chat in ChatML, a piece per message, then the assistant's generation prompt:
    the rendering for engines without a chat template of their own (OpenAI engines map it
    back onto chat messages)."""
    pieces = [f"{CHATML_START}{m['role']}\n{m['content']}{CHATML_END}\n" for m in messages]
    return [*pieces, f"{CHATML_START}assistant\n"]


async def render_chat(
    core: ServeCore, model: str, chat: RenderChatRequest, plan: ToolPlan | None = None
) -> tuple[list[str], ToolSyntax]:
    """The prompt pieces of a chat for ``model``, and the tool syntax its answer is to be
    in: its own template, applied by an engine of that model that offers it (tools and tool
    turns in the model's syntax, the engine's choice), else ChatML with tools and tool turns
    in Parrot's generic format (``plan``: the chat's tool plan, from the same fields)."""
    rendered = await core.engines.render_chat(model, chat)
    if rendered is None:
        return chatml_pieces(GENERIC.render(chat.messages, plan).messages), GENERIC
    if rendered.tool_syntax not in SYNTAXES:
        raise BadEngineAnswerError(
            f"the engine of {model!r} renders tools in a syntax this ServeCore does not know: "
            f"{rendered.tool_syntax!r} (known: {', '.join(SYNTAXES)})"
        )
    return rendered.pieces, SYNTAXES[rendered.tool_syntax].bound(plan)


class OneShot:
    def __init__(self, core: ServeCore, session: Session, trace: RequestTrace | None = None) -> None:
        self.core = core
        self.session = session
        self.calls: list[RequestChain] = []
        self.trace = trace

    @classmethod
    async def start(
        cls,
        core: ServeCore,
        pieces: list[str],
        sampling: SamplingParams,
        n: int,
        model: str,
        stream: bool = False,
        trace: RequestTrace | None = None,
    ) -> OneShot:
        """``stream``: the answer is streamed (its deltas are wanted as they come);
        ``trace``: the request's, to end with the run."""
        session, _ = await core.sessions.create(stored=False)
        run = cls(core, session, trace)
        if trace is not None:
            trace.running(model, run.calls)
        try:
            for index in range(n):
                seeded = sampling
                if sampling.seed is not None and index:  # n choices from one seed must differ
                    seeded = msgspec.structs.replace(sampling, seed=sampling.seed + index)
                call = await core.calls.submit_prompt(session, pieces, seeded, [model])
                call.chains[0].gen.var.stream.live = stream
                run.calls.append(call)
        except BaseException:
            await run.close()
            raise
        return run

    async def answers(self) -> list[Answer]:
        """Wait for every choice (a failed one raises its error); the session is closed."""
        try:
            with self._watch():
                out = []
                for call in self.calls:
                    chain = call.chains[0]
                    text = await self.core.vars.wait_value(chain.gen.var)
                    out.append(Answer(text, chain.result.finish_reason, len(chain.result.token_ids)))
                return out
        finally:
            await self.close()

    async def events(self) -> AsyncIterator[Delta | Finish]:
        """Text deltas of all choices as they are generated (each choice's output followed
        as ``GET /v1/semantic_var/{id}/stream`` follows it), and each choice's finish."""
        queue: asyncio.Queue[Delta | Finish | BaseException] = asyncio.Queue()
        followers = [asyncio.create_task(self._follow(i, c, queue)) for i, c in enumerate(self.calls)]
        try:
            with self._watch():
                finished = 0
                while finished < len(self.calls):
                    event = await queue.get()
                    if isinstance(event, BaseException):
                        raise event
                    finished += isinstance(event, Finish)
                    if finished == len(self.calls) and self.trace is not None:
                        self.trace.end(RequestStatus.DONE)  # before the last event: its reader may stop there
                    yield event
        finally:
            for follower in followers:
                follower.cancel()
            await self.close()

    async def _follow(self, index: int, call: RequestChain, queue: asyncio.Queue) -> None:
        chain = call.chains[0]
        var, stream, position = chain.gen.var, chain.gen.var.stream, 0
        while True:
            settled = var.settled.is_set()  # before the read: what follows it is all there
            text, _, position = stream.read(position)  # (read text is seen: it never reruns)
            if text:
                queue.put_nowait(Delta(index, text))
            if settled:
                break
            await stream.changed()
        try:
            await self.core.vars.wait_value(var)
        except Exception as error:  # the producer failed: the stream ends with its reason
            queue.put_nowait(error)
        else:
            queue.put_nowait(Finish(index, chain.result.finish_reason, len(chain.result.token_ids)))

    def _watch(self) -> AbstractContextManager[None]:
        """What ends the run's answer ends its request's trace (when it has one)."""
        return self.trace.watch(done=True) if self.trace is not None else nullcontext()

    def usage(self, completion_tokens: int) -> Usage:
        first = next((c.chains[0].result for c in self.calls if c.chains[0].result is not None), None)
        prompt = first.prompt_tokens if first is not None else 0
        cached = first.cached_tokens if first is not None else 0
        return usage(prompt, completion_tokens, cached)

    async def close(self) -> None:
        if self.session.session_id in self.core.sessions:
            await self.core.sessions.delete(self.session)
