"""HTTP server of the builtin engine: the Fill / Generate engine API (and OpenAI routes).

Each group of routes is a controller that declares its path and dependencies once; every
handler gets the engine as its ``engine`` dependency (:mod:`.deps`).
"""

from __future__ import annotations

import msgspec
from litestar import Controller, Litestar, Request, Response, get, post
from litestar.datastructures import State
from litestar.logging.config import LoggingConfig
from litestar.params import JSONBody
from litestar.response import ServerSentEvent

from parrot.engines.builtin import text_work
from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.loading import EngineLoader
from parrot.engines.builtin.metrics import CONTENT_TYPE
from parrot.engines.builtin.server.deps import ENGINE, EngineDep, engine_state
from parrot.engines.builtin.server.openai_api import tool_syntax
from parrot.engines.protocol import access_log
from parrot.engines.protocol.disconnect import unless_disconnected
from parrot.engines.protocol.error_docs import BODY, error_responses
from parrot.engines.protocol.error_responses import exception_handlers
from parrot.engines.protocol.errors import BadRequestError, NotFoundError, ParrotError
from parrot.engines.protocol.event_stream import EventStream
from parrot.engines.protocol.json_body import JsonRequest, refuse_declared_oversize
from parrot.engines.protocol.openai_requests import Chat, read_tools
from parrot.engines.protocol.schemas import (
    AbortRangeRequest,
    AbortRequest,
    AbortResponse,
    EngineHealth,
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
)
from parrot.engines.protocol.stream_docs import EventStreamOnly


def _checkpoints(data: FillRequest | GenerateRequest) -> list[tuple[int, int]]:
    return [(c.context_id, c.length) for c in data.checkpoints]


def _generate_args(data: GenerateRequest) -> dict:
    return {
        "parent_len": data.parent_len,
        "token_ids": data.token_ids,
        "text": data.text,
        "priority": data.priority,
        "checkpoints": _checkpoints(data),
        "parent_timeout_ms": data.parent_timeout_ms,
    }


class EngineAPI(Controller):
    """The engine API a ServeCore uses (``HttpEngine``), and the engine's own status."""

    path = "/"
    dependencies = ENGINE

    @post("/fill", status_code=200, responses=error_responses(BODY, 404, 409, 503))
    async def fill(self, data: JSONBody[FillRequest], engine: EngineDep, request: Request) -> FillResponse:
        work = engine.fill(
            data.context_id,
            data.token_ids,
            data.text,
            data.parent_context_id,
            parent_len=data.parent_len,
            priority=data.priority,
            checkpoints=_checkpoints(data),
            parent_timeout_ms=data.parent_timeout_ms,
            background=data.background,
        )
        return await unless_disconnected(request, work)

    @post("/generate", status_code=200, responses=error_responses(BODY, 404, 409, 503))
    async def generate(
        self, data: JSONBody[GenerateRequest], engine: EngineDep, request: Request
    ) -> GenerateResponse:
        """A client that disconnects stops its generation (and the contexts it created go)."""
        args = _generate_args(data)
        work = engine.generate(data.context_id, data.sampling, data.parent_context_id, **args)
        return await unless_disconnected(request, work)

    @post(
        "/generate_stream",
        status_code=200,
        responses=error_responses(BODY, 404, 409, 503),
        operation_class=EventStreamOnly,
    )
    async def generate_stream(self, data: JSONBody[GenerateRequest], engine: EngineDep) -> ServerSentEvent:
        args = _generate_args(data)
        stream = engine.generate_stream(
            data.context_id, data.sampling, data.parent_context_id, **args,
            stream_interval_ms=data.stream_interval_ms,
        )  # fmt: skip
        # Pull the first event before answering, so a bad request still gets its 4xx status.
        first = await anext(stream)

        async def events():
            event = first
            while True:
                if isinstance(event, StreamEnd):
                    yield {"event": "end", "data": msgspec.json.encode(event).decode()}
                    return
                yield {"event": "token", "data": msgspec.json.encode(event).decode()}
                try:
                    event = await anext(stream)
                except ParrotError as error:  # after the answer began: its end says why
                    body = {"status": error.status_code, "code": error.code, "message": str(error)}
                    yield {"event": "error", "data": msgspec.json.encode(body).decode()}
                    return

        return EventStream(events())

    @post("/free_context", status_code=200, responses=error_responses(BODY, 503))
    async def free_context(
        self, data: JSONBody[FreeContextRequest], engine: EngineDep
    ) -> FreeContextResponse:
        freed = await engine.free_context(data.context_id)
        return FreeContextResponse(context_id=data.context_id, freed_tokens=freed)

    @post("/abort", status_code=200, responses=error_responses(BODY, 503))
    async def abort(self, data: JSONBody[AbortRequest], engine: EngineDep) -> AbortResponse:
        """Stop the jobs on these contexts (their requests fail with ``aborted``) and free them."""
        return await engine.abort(data.context_ids)

    @post("/abort_range", status_code=200, responses=error_responses(BODY))
    async def abort_range(self, data: JSONBody[AbortRangeRequest], engine: EngineDep) -> AbortResponse:
        """:func:`abort` for every context with ``start <= id < end`` (a dead ServeCore's)."""
        if data.end <= data.start:
            raise BadRequestError("abort_range needs start < end")
        return await engine.abort_range(data.start, data.end)

    @post("/render_chat", status_code=200, responses=error_responses(BODY))
    async def render_chat(self, data: JSONBody[RenderChatRequest], engine: EngineDep) -> RenderChatResponse:
        """The model's chat template applied for a ServeCore, in message-boundary pieces;
        tools and tool turns in the model's tool syntax, which the answer names."""
        # The schemas were checked by the ServeCore's front; the answer's constraint is
        # compiled when it is generated. Rendering needs the plan only.
        plan = read_tools(data.tools, data.tool_choice, data.parallel_tool_calls, check_schemas=False)
        syntax = tool_syntax(engine)
        chat = Chat(data.messages, plan).render(syntax)
        pieces = await text_work.chat_prompt_pieces(engine.tokenizer, chat)
        return RenderChatResponse(pieces=pieces, tool_syntax=syntax.name)

    @get("/tokenizer", media_type="application/json", responses=error_responses(404))
    async def tokenizer_file(self, engine: EngineDep) -> Response:
        """The model's ``tokenizer.json``, so a ServeCore can tokenize prompts itself (once per
        model) and send token ids; 404 for a tokenizer without one."""
        path = engine.model_folder / "tokenizer.json"
        if not path.is_file():
            raise NotFoundError("this model's tokenizer has no tokenizer.json")
        return Response(content=path.read_bytes(), media_type="application/json")

    @get("/healthz", responses=error_responses(503))
    async def healthz(self, state: State) -> Response[EngineHealth]:
        """200 ``ok`` once the engine serves; 503 ``loading`` with the stage while its
        model loads (the port is bound at once: see :mod:`parrot.engines.builtin.loading`)."""
        held = state.engine
        if isinstance(held, EngineLoader) and not held.loaded:
            return Response(EngineHealth(status="loading", stage=held.stages.describe()), status_code=503)
        return Response(EngineHealth(status="ok"))

    @get("/ping")
    async def ping(self, engine: EngineDep) -> dict:
        return engine.stats_now()

    @get("/metrics", media_type=CONTENT_TYPE)
    async def metrics(self, engine: EngineDep) -> bytes:
        """Prometheus text format (``prometheus_client``)."""
        return engine.metrics.render()

    @post("/tokenize", status_code=200, responses=error_responses(BODY))
    async def tokenize(self, data: JSONBody[TokenizeRequest], engine: EngineDep) -> TokenizeResponse:
        return TokenizeResponse(token_ids=await text_work.tokenize(engine.tokenizer, data.text))


# A request body at most (413 beyond, naming the limit): far above the token ids of any
# prompt a model's context holds, and above the largest prompt a ServeCore accepts.
MAX_BODY_BYTES = 32 * 2**20


def create_app(
    engine: BuiltinEngine | EngineLoader, manage_engine: bool = True, max_body_bytes: int = MAX_BODY_BYTES
) -> Litestar:
    """The engine's Litestar app; with ``manage_engine`` the engine thread runs for the app's
    lifetime. ``engine`` may still be loading (an :class:`EngineLoader`): the routes answer
    503 until it is built."""
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")

    def start() -> None:
        if isinstance(engine, BuiltinEngine):
            engine.check_running()

    def stop() -> None:
        engine.stop()

    from parrot.engines.builtin.server.openai_api import OpenAIAPI

    return Litestar(
        # the process's logging is the CLI's (--log-level); Litestar would reset the root to INFO
        logging_config=LoggingConfig(configure_root_logger=False),
        route_handlers=[EngineAPI, OpenAIAPI],
        state=engine_state(engine),
        exception_handlers=exception_handlers(),
        request_max_body_size=max_body_bytes,
        request_class=JsonRequest,
        before_request=access_log.before_request(refuse_declared_oversize),
        before_send=[access_log.before_send],
        on_startup=[start] if manage_engine else [],
        on_shutdown=[stop] if manage_engine else [],
        debug=False,
    )
