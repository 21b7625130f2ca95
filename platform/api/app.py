"""Routes of the Parrot REST API, one controller per domain (sessions, variables, calls,
engines, health), as thin as they can be: each turns its request body into domain types,
calls a ServeCore service and shapes the answer. Every handler gets the ServeCore as the
``core`` dependency and opens sessions with the ``sessions`` dependency (the Bearer
header's ``session_auth``), both declared once on the app (:mod:`.deps`)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Annotated

from litestar import Controller, Litestar, Request, Response, delete, get, post, put
from litestar.datastructures import State
from litestar.logging.config import LoggingConfig
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter
from litestar.response import ServerSentEvent
from litestar.types import ControllerRouterHandler

from parrot.engines.protocol import access_log
from parrot.engines.protocol.error_docs import (
    ADMIN,
    BODY,
    CREATES,
    PARAMS,
    SESSION,
    STORE,
    VALUES,
    error_responses,
)
from parrot.engines.protocol.error_responses import exception_handlers
from parrot.engines.protocol.event_stream import EventStream
from parrot.engines.protocol.json_body import JsonRequest, OptionalJsonRequest, refuse_declared_oversize
from parrot.platform.api.adapter_routes import AdapterController
from parrot.platform.api.auth import Sessions, admin_guard
from parrot.platform.api.bodies import binding, engine_spec, transform_binding
from parrot.platform.api.call_batches import CallBatchController
from parrot.platform.api.deps import DEPENDENCIES, Core
from parrot.platform.api.openai_front import OpenAIController
from parrot.platform.api.token_throttle import TokenThrottle
from parrot.platform.api.var_stream_events import sse_messages
from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.ops.metrics import CONTENT_TYPE
from parrot.platform.serve.ops.observe import ContextTreeView, SessionDag
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.wire.bodies import CreateVar, NewSession, RegisterEngine, SetVar, SubmitCall, SubmitTransform
from parrot.wire.responses import (
    CallInfo,
    CallSubmitted,
    EngineInfo,
    Health,
    ParamInfo,
    SessionCreated,
    SessionInfo,
    VarInfo,
    VarSummary,
)

MAX_WAIT_S = 3600.0


def _var_info(var: SemanticVariable) -> VarInfo:
    """The variable with its value, when it has one (a create, a set, a get)."""
    return VarInfo(
        var_id=var.var_id, name=var.name, ready=var.ready, value=var.value, error=var.error, format=var.format
    )


def _var_summary(var: SemanticVariable) -> VarSummary:
    """The variable in a session listing: no value (get the variable)."""
    return VarSummary(var_id=var.var_id, name=var.name, ready=var.ready, error=var.error, format=var.format)


def _call_info(call: RequestChain) -> CallInfo:
    return CallInfo(
        call_id=call.call_id,
        state=call.state,
        outputs=call.outputs(),
        engine=call.engine_id,
        timings=call.timings,
        error=call.error,
    )


class SessionController(Controller):
    path = "/v1/session"

    @post(
        status_code=201,
        responses=error_responses(BODY, CREATES, STORE),
        request_class=OptionalJsonRequest,
    )
    async def create_session(
        self, request: Request, core: Core, data: JSONBody[NewSession | None] = None
    ) -> SessionCreated:
        """A new session; the body, which may be left out, gives it a ``label`` and
        ``tags`` to find it by (the dashboard's sessions page searches them)."""
        # Counted per client address (behind a reverse proxy: the address it forwards, when
        # uvicorn trusts it: --forwarded-allow-ips), for the sessions-per-client limit.
        client = request.client.host if request.client else "unknown"
        named = data or NewSession()
        session, auth = await core.sessions.create(client=client, label=named.label, tags=named.tags)
        return SessionCreated(session_id=session.session_id, session_auth=auth)

    @get("/{session_id:str}", responses=error_responses(PARAMS, SESSION))
    async def session_info(self, session_id: FromPath[str], sessions: Sessions) -> SessionInfo:
        session = sessions(session_id)
        return SessionInfo(
            session_id=session_id,
            vars=[_var_summary(v) for v in session.vars.values()],
            calls=[_call_info(c) for c in session.calls.values()],
            label=session.label,
            tags=list(session.tags),
        )

    @get("/{session_id:str}/dag", responses=error_responses(PARAMS, SESSION))
    async def session_dag(self, session_id: FromPath[str], sessions: Sessions, core: Core) -> SessionDag:
        """The session's calls and variables as a DAG (values cut to a preview), with each
        call's state, engine, timings and filled-in template. Needs the session's auth."""
        sessions(session_id)
        return core.views.session_dag(session_id)

    @delete("/{session_id:str}", status_code=204, responses=error_responses(PARAMS, SESSION, STORE))
    async def delete_session(self, session_id: FromPath[str], sessions: Sessions, core: Core) -> None:
        await core.sessions.delete(sessions(session_id))


class VariableController(Controller):
    path = "/v1/semantic_var"

    @post(status_code=201, responses=error_responses(BODY, SESSION, CREATES, VALUES, STORE))
    async def create_var(self, data: JSONBody[CreateVar], sessions: Sessions, core: Core) -> VarInfo:
        session = sessions(data.session_id)
        return _var_info(await core.vars.create(session, data.name, data.value, data.format))

    @put("/{var_id:str}", responses=error_responses(BODY, SESSION, VALUES, STORE))
    async def set_var(
        self, var_id: FromPath[str], data: JSONBody[SetVar], sessions: Sessions, core: Core
    ) -> VarInfo:
        session = sessions(data.session_id)
        return _var_info(await core.vars.set(session, var_id, data.value))

    @get("/{var_id:str}", responses=error_responses(PARAMS, SESSION, 408, 424))
    async def get_var(
        self,
        var_id: FromPath[str],
        sessions: Sessions,
        core: Core,
        session_id: FromQuery[str],
        criteria: FromQuery[str] = "latency",
        timeout: Annotated[float, QueryParameter(ge=0, le=MAX_WAIT_S)] = 300.0,
    ) -> VarInfo:
        session = sessions(session_id)
        return _var_info(await core.vars.get(session, var_id, criteria, timeout))

    @get(
        "/{var_id:str}/stream",
        responses=error_responses(PARAMS, SESSION, 429),
        media_type="text/event-stream",
    )
    async def stream_var(
        self,
        var_id: FromPath[str],
        sessions: Sessions,
        core: Core,
        session_id: FromQuery[str],
        criteria: FromQuery[str] = "latency",
    ) -> ServerSentEvent:
        """The variable's value as it is written: ``delta`` events, then ``value`` (or
        ``error``); see :mod:`parrot.wire.var_stream`."""
        events = core.streams.follow(sessions(session_id), var_id, criteria)
        return EventStream(sse_messages(events), headers={"Cache-Control": "no-store"})


class CallController(Controller):
    path = "/v1"

    @post(
        "/semantic_call",
        status_code=201,
        responses=error_responses(BODY, SESSION, 409, CREATES, VALUES, STORE),
    )
    async def submit_call(self, data: JSONBody[SubmitCall], sessions: Sessions, core: Core) -> CallSubmitted:
        session = sessions(data.session_id)
        bindings = [binding(p) for p in data.parameters]
        call, outputs = await core.calls.submit(
            session, data.template, bindings, data.models, data.output_criteria
        )
        info = [
            ParamInfo(name=p.name, is_output=p.is_output, var_id=outputs.get(p.name) or p.var_id)
            for p in data.parameters
        ]
        return CallSubmitted(call_id=call.call_id, outputs=outputs, param_info=info)

    @post(
        "/semantic_transform",
        status_code=201,
        responses=error_responses(BODY, SESSION, 409, CREATES, VALUES, STORE),
    )
    async def submit_transform(
        self, data: JSONBody[SubmitTransform], sessions: Sessions, core: Core
    ) -> CallSubmitted:
        session = sessions(data.session_id)
        inputs = [transform_binding(item, n) for n, item in enumerate(data.inputs)]
        call, outputs = await core.calls.submit_transform(session, inputs, data.steps, data.output)
        info = [
            ParamInfo(name=n.var.name, is_output=False, var_id=n.var.var_id) for n in call.chains[0].fills
        ]
        info.append(ParamInfo(name=data.output, is_output=True, var_id=outputs[data.output]))
        return CallSubmitted(call_id=call.call_id, outputs=outputs, param_info=info)

    @get("/semantic_call/{call_id:str}", responses=error_responses(PARAMS, SESSION))
    async def call_info(
        self, call_id: FromPath[str], sessions: Sessions, core: Core, session_id: FromQuery[str]
    ) -> CallInfo:
        session = sessions(session_id)
        return _call_info(core.calls.find(session, call_id))


class EngineController(Controller):
    """Listing engines is open; changing them, or seeing every session's contexts on one,
    needs the admin token."""

    path = "/v1/engines"

    @get()
    async def list_engines(self, core: Core) -> list[EngineInfo]:
        return core.views.engine_views()

    @post(status_code=201, guards=[admin_guard], responses=error_responses(BODY, ADMIN, 409, STORE))
    async def register_engine(self, data: JSONBody[RegisterEngine], core: Core) -> EngineInfo:
        slot = await core.engines.register(engine_spec(data))
        return core.views.engine_view(slot.engine_id)

    @delete(
        "/{engine_id:str}",
        status_code=204,
        guards=[admin_guard],
        responses=error_responses(PARAMS, ADMIN, 404, STORE),
    )
    async def remove_engine(self, engine_id: FromPath[str], core: Core) -> None:
        await core.engines.remove(engine_id)

    @get("/{engine_id:str}/contexts", guards=[admin_guard], responses=error_responses(PARAMS, ADMIN, 404))
    async def engine_contexts(self, engine_id: FromPath[str], core: Core) -> ContextTreeView:
        """The prefix tree of the contexts held on an engine, with the sessions holding each
        node. Needs the admin token (it shows every session's use of the engine)."""
        return core.views.context_tree(engine_id)


class HealthController(Controller):
    path = "/"

    @get("/metrics", media_type=CONTENT_TYPE)
    async def metrics(self, core: Core) -> bytes:
        """Prometheus text format (``prometheus_client``)."""
        return core.metrics.render(core.views.stats())

    @get("/healthz", responses=error_responses(503))
    async def healthz(self, core: Core) -> Response[Health]:
        """Whether the server can serve calls: 200 ``ok``, or ``degraded`` with its reason
        (no engine up); 503 ``loading`` with the stage while the engine ``parrot serve``
        started loads its model (as llama.cpp's server answers while it loads)."""
        views = core.views.engine_views()
        up = sum(view.up for view in views)
        stage = core.engines.loading.stage
        if stage is not None and not up:
            health = Health(
                status="loading", engines=len(views), stage=stage, reason=core.engines.loading.describe()
            )
            return Response(health, status_code=503)
        reason = None if up else ("no engine is up" if views else "no engine is registered")
        health = Health(
            status="degraded" if reason else "ok", engines=len(views), engines_up=up, reason=reason
        )
        return Response(health)


def create_app(
    core: ServeCore,
    engine_urls: tuple[str, ...] = (),
    admin_token: str | None = None,
    openai_api_keys: tuple[str, ...] = (),
    own_engine: str | None = None,
    pages: Sequence[ControllerRouterHandler] = (),
) -> Litestar:
    """The API app; on start it starts the core (restoring what its store holds) and
    registers the given engines (``own_engine``: the one among them that ``parrot serve``
    started itself). ``pages``: more routes served beside the API (the dashboard's: the
    serve layer knows nothing of them, :func:`parrot.web.app.create_server_app` adds them)."""

    async def start() -> None:
        await core.start(engine_urls, own_engine)

    async def stop() -> None:
        await core.stop()

    return Litestar(
        # the process's logging is the CLI's (--log-level); Litestar would reset the root to INFO
        logging_config=LoggingConfig(configure_root_logger=False),
        route_handlers=[
            SessionController,
            VariableController,
            CallController,
            CallBatchController,
            EngineController,
            HealthController,
            OpenAIController,
            AdapterController,
            *pages,
        ],
        dependencies=DEPENDENCIES,
        # Without a configured token nobody is admin: a random one no client can know.
        state=State(
            {
                "core": core,
                "admin_token": admin_token or secrets.token_urlsafe(32),
                "openai_api_keys": tuple(openai_api_keys),
                "token_throttle": TokenThrottle(),
            }
        ),
        exception_handlers=exception_handlers(),
        request_max_body_size=core.limits.max_body_bytes,
        request_class=JsonRequest,
        before_request=access_log.before_request(refuse_declared_oversize),
        before_send=[access_log.before_send],
        on_startup=[start],
        on_shutdown=[stop],
    )
