"""The fake engine over HTTP: the engine API's routes (those ``HttpEngine`` uses) with the
protocol's own request, response and error types and the same event streams, in a thread."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import msgspec
from litestar import Litestar, Request, get, post
from litestar.logging.config import LoggingConfig
from litestar.params import JSONBody
from litestar.response import ServerSentEvent
from servers import ServerThread

from fake_engine.engine import FakeEngine
from fake_engine.tokens import tokenizer_json
from parrot.engines.protocol.disconnect import unless_disconnected
from parrot.engines.protocol.error_responses import exception_handlers
from parrot.engines.protocol.event_stream import EventStream
from parrot.engines.protocol.openai_requests import read_tools
from parrot.engines.protocol.schemas import (
    AbortRangeRequest,
    AbortRequest,
    AbortResponse,
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
from parrot.wire.tool_syntax import GENERIC


def create_app(engine: Callable[[], FakeEngine]) -> Litestar:
    """The builtin engine's API (the routes ``HttpEngine`` uses, their bodies, error bodies
    and event streams: the protocol's own types and error translator) over ``engine()``,
    the engine of the moment (a test's own, when the server outlives one test)."""

    @post("/fill", status_code=200)
    async def fill(data: JSONBody[FillRequest], request: Request) -> FillResponse:
        checkpoints = [(c.context_id, c.length) for c in data.checkpoints]
        work = engine().fill(
            data.context_id,
            data.token_ids,
            data.text,
            data.parent_context_id,
            parent_len=data.parent_len,
            priority=data.priority,
            checkpoints=checkpoints,
            parent_timeout_ms=data.parent_timeout_ms,
            background=data.background,
        )
        return await unless_disconnected(request, work)  # a caller that goes away stops it

    def generation(data: JSONBody[GenerateRequest]) -> AsyncIterator[TokenStreamEvent | StreamEnd]:
        return engine().generate_stream(
            data.context_id,
            data.sampling,
            data.parent_context_id,
            parent_len=data.parent_len,
            token_ids=data.token_ids,
            text=data.text,
            priority=data.priority,
            checkpoints=[(c.context_id, c.length) for c in data.checkpoints],
            parent_timeout_ms=data.parent_timeout_ms,
            stream_interval_ms=data.stream_interval_ms,
        )

    @post("/generate", status_code=200)
    async def generate(data: JSONBody[GenerateRequest], request: Request) -> GenerateResponse:
        args = {
            f: getattr(data, f) for f in ("parent_len", "token_ids", "text", "priority", "parent_timeout_ms")
        }
        checkpoints = [(c.context_id, c.length) for c in data.checkpoints]
        work = engine().generate(
            data.context_id, data.sampling, data.parent_context_id, checkpoints=checkpoints, **args
        )
        return await unless_disconnected(request, work)

    @post("/generate_stream", status_code=200)
    async def generate_stream(data: JSONBody[GenerateRequest]) -> ServerSentEvent:
        stream = generation(data)
        first = await anext(stream)  # a bad request still gets its 4xx status

        async def events():
            event = first
            while True:
                name = "end" if isinstance(event, StreamEnd) else "token"
                yield {"event": name, "data": msgspec.json.encode(event).decode()}
                if name == "end":
                    return
                event = await anext(stream)

        return EventStream(events())

    @post("/free_context", status_code=200)
    async def free_context(data: JSONBody[FreeContextRequest]) -> FreeContextResponse:
        freed = await engine().free_context(data.context_id)
        return FreeContextResponse(context_id=data.context_id, freed_tokens=freed)

    @post("/abort", status_code=200)
    async def abort(data: JSONBody[AbortRequest]) -> AbortResponse:
        return await engine().abort(data.context_ids)

    @post("/abort_range", status_code=200)
    async def abort_range(data: JSONBody[AbortRangeRequest]) -> AbortResponse:
        return await engine().abort_range(data.start, data.end)

    @post("/tokenize", status_code=200)
    async def tokenize(data: JSONBody[TokenizeRequest]) -> TokenizeResponse:
        return TokenizeResponse(token_ids=await engine().tokenize(data.text))

    @get("/tokenizer", media_type="application/json")
    async def tokenizer() -> str:
        return tokenizer_json()

    @post("/render_chat", status_code=200)
    async def render_chat(data: JSONBody[RenderChatRequest]) -> RenderChatResponse:
        plan = read_tools(data.tools, data.tool_choice, data.parallel_tool_calls)
        messages = GENERIC.render(data.messages, plan).messages  # its template knows no tools
        return RenderChatResponse(pieces=engine().tokenizer.chat_pieces(messages))

    @get("/ping")
    async def ping() -> dict:
        return await engine().ping()

    handlers = [fill, generate, generate_stream, free_context, abort, abort_range, tokenize, tokenizer]
    return Litestar(
        route_handlers=[*handlers, render_chat, ping],
        exception_handlers=exception_handlers(),
        logging_config=LoggingConfig(configure_root_logger=False),
    )


class FakeEngineServer(ServerThread):
    """A :class:`FakeEngine` served over HTTP in a thread: a ServeCore registers ``url``."""

    def __init__(self, engine: FakeEngine | None = None, port: int | None = None) -> None:
        self.engine = engine or FakeEngine()
        super().__init__(create_app(lambda: self.engine), port)
