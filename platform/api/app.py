"""Routes of the Parrot REST API. Each reads the session from the Bearer header."""

from __future__ import annotations

import secrets
from typing import Annotated

from litestar import Litestar, Request, delete, get, post, put
from litestar.datastructures import State
from litestar.logging.config import LoggingConfig
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from parrot.engines.protocol.error_docs import ADMIN, BODY, CREATES, PARAMS, SESSION, STORE, error_responses
from parrot.engines.protocol.http import exception_handlers
from parrot.engines.protocol.json_body import JsonRequest
from parrot.platform.api.adapter_routes import adapter_routes
from parrot.platform.api.auth import SESSIONS, Sessions, admin_guard
from parrot.platform.api.openai_front import openai_front
from parrot.platform.api.schemas import CreateVar, RegisterEngine, SetVar, SubmitCall, SubmitTransform
from parrot.platform.serve.core import EngineView, ServeCore
from parrot.platform.serve.graph import RequestChain, SemanticVariable
from parrot.platform.serve.metrics import CONTENT_TYPE
from parrot.platform.serve.observe import ContextTreeView, SessionDag
from parrot.web.app import dashboard_routes
from parrot.web.config import DashboardConfig
from parrot.wire.responses import (
    CallInfo,
    CallSubmitted,
    EngineInfo,
    Health,
    ParamInfo,
    SessionCreated,
    SessionInfo,
    VarInfo,
)

MAX_WAIT_S = 3600.0


def _core(state: State) -> ServeCore:
    return state.core


def _var_info(var: SemanticVariable, with_value: bool = True) -> VarInfo:
    return VarInfo(
        var_id=var.var_id,
        name=var.name,
        ready=var.ready,
        value=var.value if with_value else None,
        error=var.error,
    )


def _call_info(request: RequestChain) -> CallInfo:
    return CallInfo(
        call_id=request.call_id,
        state=request.state,
        outputs=request.outputs(),
        engine=request.engine_id,
        timings=request.timings,
        error=request.error,
    )


@post("/v1/session", status_code=201, responses=error_responses(CREATES, STORE))
async def create_session(request: Request, state: State) -> SessionCreated:
    # Counted per client address (behind a reverse proxy: the address it forwards, when
    # uvicorn trusts it: --forwarded-allow-ips), for the sessions-per-client limit.
    client = request.client.host if request.client else "unknown"
    session, auth = await _core(state).create_session(client=client)
    return SessionCreated(session_id=session.session_id, session_auth=auth)


@get("/v1/session/{session_id:str}", responses=error_responses(PARAMS, SESSION))
async def session_info(session_id: FromPath[str], sessions: Sessions, state: State) -> SessionInfo:
    session = sessions(session_id)
    return SessionInfo(
        session_id=session_id,
        vars=[_var_info(v, with_value=False) for v in session.vars.values()],
        calls=[_call_info(c) for c in session.calls.values()],
    )


@get("/v1/session/{session_id:str}/dag", responses=error_responses(PARAMS, SESSION))
async def session_dag(session_id: FromPath[str], sessions: Sessions, state: State) -> SessionDag:
    """The session's calls and variables as a DAG (values cut to a preview), with each
    call's state, engine, timings and filled-in template. Needs the session's auth."""
    sessions(session_id)
    return _core(state).session_dag(session_id)


@delete("/v1/session/{session_id:str}", status_code=204, responses=error_responses(PARAMS, SESSION, STORE))
async def delete_session(session_id: FromPath[str], sessions: Sessions, state: State) -> None:
    await _core(state).delete_session(sessions(session_id))


@post("/v1/semantic_var", status_code=201, responses=error_responses(BODY, SESSION, CREATES, STORE))
async def create_var(data: JSONBody[CreateVar], sessions: Sessions, state: State) -> VarInfo:
    session = sessions(data.session_id)
    return _var_info(await _core(state).create_var(session, data.name, data.value), with_value=False)


@put("/v1/semantic_var/{var_id:str}", responses=error_responses(BODY, SESSION, STORE))
async def set_var(var_id: FromPath[str], data: JSONBody[SetVar], sessions: Sessions, state: State) -> VarInfo:
    session = sessions(data.session_id)
    return _var_info(await _core(state).set_var(session, var_id, data.value), with_value=False)


@get("/v1/semantic_var/{var_id:str}", responses=error_responses(PARAMS, SESSION, 408, 424))
async def get_var(
    var_id: FromPath[str],
    sessions: Sessions,
    state: State,
    session_id: FromQuery[str],
    criteria: FromQuery[str] = "latency",
    timeout: Annotated[float, QueryParameter(ge=0, le=MAX_WAIT_S)] = 300.0,
) -> VarInfo:
    session = sessions(session_id)
    return _var_info(await _core(state).get_var(session, var_id, criteria, timeout))


@post("/v1/semantic_call", status_code=201, responses=error_responses(BODY, SESSION, 409, CREATES, STORE))
async def submit_call(data: JSONBody[SubmitCall], sessions: Sessions, state: State) -> CallSubmitted:
    session = sessions(data.session_id)
    call, outputs = await _core(state).submit_call(
        session, data.template, data.parameters, data.models, data.output_criteria
    )
    info = [
        ParamInfo(name=p.name, is_output=p.is_output, var_id=outputs.get(p.name) or p.var_id)
        for p in data.parameters
    ]
    return CallSubmitted(call_id=call.call_id, outputs=outputs, param_info=info)


@post(
    "/v1/semantic_transform", status_code=201, responses=error_responses(BODY, SESSION, 409, CREATES, STORE)
)
async def submit_transform(
    data: JSONBody[SubmitTransform], sessions: Sessions, state: State
) -> CallSubmitted:
    session = sessions(data.session_id)
    call, outputs = await _core(state).submit_transform(session, data.inputs, data.steps, data.output)
    info = [ParamInfo(name=n.var.name, is_output=False, var_id=n.var.var_id) for n in call.chains[0].fills]
    info.append(ParamInfo(name=data.output, is_output=True, var_id=outputs[data.output]))
    return CallSubmitted(call_id=call.call_id, outputs=outputs, param_info=info)


@get("/v1/semantic_call/{call_id:str}", responses=error_responses(PARAMS, SESSION))
async def call_info(
    call_id: FromPath[str], sessions: Sessions, state: State, session_id: FromQuery[str]
) -> CallInfo:
    session = sessions(session_id)
    return _call_info(_core(state).call(session, call_id))


def _engine_info(view: EngineView) -> EngineInfo:
    return EngineInfo(
        engine_id=view.engine_id,
        kind=view.kind,
        url=view.url,
        model=view.model,
        up=view.up,
        running=view.running,
        capacity=view.capacity,
    )


@get("/v1/engines")
async def list_engines(state: State) -> list[EngineInfo]:
    return [_engine_info(v) for v in _core(state).engine_views()]


@post(
    "/v1/engines", status_code=201, guards=[admin_guard], responses=error_responses(BODY, ADMIN, 409, STORE)
)
async def register_engine(data: JSONBody[RegisterEngine], state: State) -> EngineInfo:
    core = _core(state)
    slot = await core.register(data.spec())
    return _engine_info(core.engine_view(slot.engine_id))


@delete(
    "/v1/engines/{engine_id:str}",
    status_code=204,
    guards=[admin_guard],
    responses=error_responses(PARAMS, ADMIN, 404, STORE),
)
async def remove_engine(engine_id: FromPath[str], state: State) -> None:
    await _core(state).remove_engine(engine_id)


@get(
    "/v1/engines/{engine_id:str}/contexts",
    guards=[admin_guard],
    responses=error_responses(PARAMS, ADMIN, 404),
)
async def engine_contexts(engine_id: FromPath[str], state: State) -> ContextTreeView:
    """The prefix tree of the contexts held on an engine, with the sessions holding each
    node. Needs the admin token (it shows every session's use of the engine)."""
    return _core(state).context_tree(engine_id)


@get("/metrics", media_type=CONTENT_TYPE)
async def metrics(state: State) -> bytes:
    """Prometheus text format (``prometheus_client``)."""
    return _core(state).metrics.render()


@get("/healthz")
async def healthz(state: State) -> Health:
    """Liveness (always 200 while the server answers) and whether it can serve calls."""
    views = _core(state).engine_views()
    up = sum(view.up for view in views)
    reason = None if up else ("no engine is up" if views else "no engine is registered")
    return Health(status="degraded" if reason else "ok", engines=len(views), engines_up=up, reason=reason)


def create_app(
    core: ServeCore,
    engine_urls: tuple[str, ...] = (),
    admin_token: str | None = None,
    openai_api_keys: tuple[str, ...] = (),
    dashboard: DashboardConfig | None = None,
) -> Litestar:
    """The API app; on start it starts the core (restoring what its store holds) and
    registers the given engines. The dashboard's pages (``parrot.web``) are served by it
    too, unless ``dashboard.enabled`` is False."""
    dashboard = dashboard or DashboardConfig()
    pages = dashboard_routes(dashboard) if dashboard.enabled else []

    async def start() -> None:
        await core.start(engine_urls)

    async def stop() -> None:
        await core.stop()

    return Litestar(
        # the process's logging is the CLI's (--log-level); Litestar would reset the root to INFO
        logging_config=LoggingConfig(configure_root_logger=False),
        route_handlers=[
            create_session,
            session_info,
            session_dag,
            delete_session,
            create_var,
            set_var,
            get_var,
            submit_call,
            submit_transform,
            call_info,
            healthz,
            list_engines,
            register_engine,
            remove_engine,
            engine_contexts,
            metrics,
            openai_front(),
            adapter_routes(),
            *pages,
        ],
        dependencies=SESSIONS,
        # Without a configured token nobody is admin: a random one no client can know.
        state=State(
            {
                "core": core,
                "admin_token": admin_token or secrets.token_urlsafe(32),
                "openai_api_keys": tuple(openai_api_keys),
            }
        ),
        exception_handlers=exception_handlers(),
        request_max_body_size=core.limits.max_body_bytes,
        request_class=JsonRequest,
        on_startup=[start],
        on_shutdown=[stop],
    )
