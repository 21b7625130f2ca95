"""One OpenAI-style request as a one-call session on the ServeCore.

The OpenAI front (``/v1/completions``, ``/v1/chat/completions``) runs each request as a
session of its own that is never stored: ``n`` latency-critical generations after the same
text pieces. The pieces (a chat's messages) are constant text: their boundaries are
prefixes kept as contexts shared by every request, so the system prompt (and any shared
chat history) of many requests is held once per engine, and the scheduler sees these
requests next to the DAGs of Parrot sessions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec

from parrot.engines.protocol.openai_stream import Answer, Delta, Finish, usage
from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.sessions.service import Session
from parrot.wire.chat import ChatTurn
from parrot.wire.openai_schemas import Usage
from parrot.wire.sampling import SamplingParams
from parrot.wire.tool_calls import render_turns

CHATML_START, CHATML_END = "<|im_start|>", "<|im_end|>"


def chatml_pieces(messages: list[ChatTurn]) -> list[str]:
    """The chat in ChatML, a piece per message, then the assistant's generation prompt:
    the rendering for engines without a chat template of their own (OpenAI engines map it
    back onto chat messages)."""
    pieces = [f"{CHATML_START}{m.role}\n{m.content}{CHATML_END}\n" for m in messages]
    return [*pieces, f"{CHATML_START}assistant\n"]


async def render_chat(core: ServeCore, model: str, messages: list[ChatTurn]) -> list[str]:
    """The prompt pieces of a chat for ``model``: its own template, applied by an engine
    of that model that offers it, else ChatML. Assistant tool calls and tool results are
    rendered in Parrot's generic tool format first (templates know plain turns only)."""
    messages = render_turns(messages, None)
    pieces = await core.engines.render_chat(model, messages)
    return pieces if pieces is not None else chatml_pieces(messages)


class OneShot:
    def __init__(self, core: ServeCore, session: Session, stream: bool) -> None:
        self.core = core
        self.session = session
        self.requests: list[RequestChain] = []
        self.queue: asyncio.Queue | None = asyncio.Queue() if stream else None

    @classmethod
    async def start(
        cls,
        core: ServeCore,
        pieces: list[str],
        sampling: SamplingParams,
        n: int,
        model: str,
        stream: bool = False,
    ) -> OneShot:
        session, _ = await core.sessions.create(stored=False)
        run = cls(core, session, stream)
        try:
            for index in range(n):
                seeded = sampling
                if sampling.seed is not None and index:  # n choices from one seed must differ
                    seeded = msgspec.structs.replace(sampling, seed=sampling.seed + index)
                on_token = None
                if run.queue is not None:
                    on_token = run._token_sink(index)
                run.requests.append(
                    await core.calls.submit_prompt(session, pieces, seeded, [model], on_token)
                )
        except BaseException:
            await run.close()
            raise
        return run

    def _token_sink(self, index: int):
        queue = self.queue

        def put(text: str) -> None:
            queue.put_nowait(Delta(index, text))

        return put

    async def answers(self) -> list[Answer]:
        """Wait for every choice (a failed one raises its error); the session is closed."""
        try:
            out = []
            for request in self.requests:
                chain = request.chains[0]
                text = await self.core.vars.wait_value(chain.gen.var)
                out.append(Answer(text, chain.result.finish_reason, len(chain.result.token_ids)))
            return out
        finally:
            await self.close()

    async def events(self) -> AsyncIterator[Delta | Finish]:
        """Text deltas of all choices as they are generated, and each choice's finish."""
        watchers = [asyncio.create_task(self._finish(i, r)) for i, r in enumerate(self.requests)]
        try:
            finished = 0
            while finished < len(self.requests):
                event = await self.queue.get()
                if isinstance(event, BaseException):
                    raise event
                finished += isinstance(event, Finish)
                yield event
        finally:
            for watcher in watchers:
                watcher.cancel()
            await self.close()

    async def _finish(self, index: int, request: RequestChain) -> None:
        chain = request.chains[0]
        try:
            await self.core.vars.wait_value(chain.gen.var)
        except Exception as error:  # the producer failed: the stream ends with its reason
            self.queue.put_nowait(error)
        else:
            self.queue.put_nowait(Finish(index, chain.result.finish_reason, len(chain.result.token_ids)))

    def usage(self, completion_tokens: int) -> Usage:
        first = next((r.chains[0].result for r in self.requests if r.chains[0].result is not None), None)
        prompt = first.prompt_tokens if first is not None else 0
        cached = first.cached_tokens if first is not None else 0
        return usage(prompt, completion_tokens, cached)

    async def close(self) -> None:
        if self.session.session_id in self.core.sessions:
            await self.core.sessions.delete(self.session)
