"""The dashboard's routes, plugged into the API's Litestar app (``create_app``).

Pages: ``/`` (overview), ``/sessions``, ``/sessions/{id}``, ``/contexts``, ``/engines``;
their live parts at ``/live/...`` (SSE); ``/login``, ``/logout``; forms ``POST /engines``
and ``POST /engines/{id}/remove``; htmx under ``/static``. Every page is complete when
rendered (it works with JavaScript off); htmx only swaps in the live updates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from litestar import MediaType, Request, Response, Router, get, post
from litestar.datastructures import State
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler
from litestar.params import Body, FromPath, FromQuery
from litestar.response import Redirect, ServerSentEvent
from litestar.static_files import create_static_files_router

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.api.deps import Core
from parrot.platform.serve.core import ServeCore
from parrot.web import auth, forms, live, views
from parrot.web.config import DashboardConfig
from parrot.web.render import environment

STATIC = Path(__file__).parent / "static"
Form = Annotated[dict[str, Any], Body(media_type=RequestEncodingType.URL_ENCODED)]


def dashboard_routes(config: DashboardConfig) -> list[HTTPRouteHandler | Router]:
    env = environment()

    def html(template: str, request: Request, code: int = 200, **context: Any) -> Response[str]:
        body = env.get_template(template).render(
            path=request.url.path,
            admin=auth.is_admin(request),
            csrf=auth.csrf_token(request),
            csrf_field=auth.CSRF_FIELD,
            **context,
        )
        return Response(
            body, media_type=MediaType.HTML, status_code=code, headers={"Cache-Control": "no-store"}
        )

    def fragment(template: str, **context: Any) -> str:
        return env.get_template(template).render(**context)

    # -- errors as pages --------------------------------------------------------------
    def not_signed_in(request: Request, error: auth.NotSignedIn) -> Response:
        if request.method == "GET" and not request.url.path.startswith("/live/"):
            target = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
            return Redirect(f"/login?next={target}", status_code=303)
        return html("error.html", request, 401, message=str(error), status=401)

    def parrot_error(request: Request, error: ParrotError) -> Response:
        status = error.status_code if 400 <= error.status_code < 600 else 500
        return html("error.html", request, status, message=str(error), status=status)

    def http_error(request: Request, error: HTTPException) -> Response:
        return html("error.html", request, error.status_code, message=error.detail, status=error.status_code)

    # The cookie session and CSRF check sit on each dashboard handler (not on a Router: a
    # Router is deep-copied when registered, and the session backend's cipher cannot be).
    common: dict[str, Any] = {
        "middleware": auth.middleware(config),
        "exception_handlers": {
            auth.NotSignedIn: not_signed_in,
            ParrotError: parrot_error,
            HTTPException: http_error,
        },
        "include_in_schema": False,
    }

    read = auth.read_guard(config)

    # -- pages ------------------------------------------------------------------------
    @get("/", **common, guards=[read])
    async def overview_page(request: Request, core: Core) -> Response[str]:
        return html("overview.html", request, model=views.overview(core.views))

    @get("/sessions", **common, guards=[read])
    async def sessions_page(request: Request, core: Core) -> Response[str]:
        return html("sessions.html", request, model=views.session_list(core.views))

    @get("/sessions/{session_id:str}", **common, guards=[read])
    async def session_page(
        request: Request, core: Core, session_id: FromPath[str], node: FromQuery[str | None] = None
    ) -> Response[str]:
        model = views.session_page(core.views, session_id, node)
        live_url = f"/live/sessions/{quote(session_id)}" + (f"?node={quote(node)}" if node else "")
        return html("session.html", request, model=model, live_url=live_url)

    @get("/contexts", **common, guards=[read])
    async def contexts_page(request: Request, core: Core) -> Response[str]:
        return html("contexts.html", request, trees=views.context_trees(core.views))

    @get("/engines", **common, guards=[read])
    async def engines_page(request: Request, core: Core) -> Response[str]:
        return html("engines.html", request, rows=views.engine_rows(core.views), form=forms.EngineForm())

    # -- admin ------------------------------------------------------------------------
    @post("/engines", status_code=303, **common, guards=[auth.admin_guard])
    async def register_engine(request: Request, core: Core, data: Form) -> Response[str] | Redirect:
        form = forms.parse(data)
        if form.spec is not None:
            try:
                await core.engines.register(form.spec)
            except ParrotError as error:
                return _engines_with(
                    request,
                    core,
                    form.with_error(forms.target_field(form), str(error)),
                    error.status_code if 400 <= error.status_code < 500 else 400,
                )
            return Redirect("/engines", status_code=303)
        return _engines_with(request, core, form, 422)

    def _engines_with(
        request: Request, core: ServeCore, form: forms.EngineForm, status: int
    ) -> Response[str]:
        return html("engines.html", request, status, rows=views.engine_rows(core.views), form=form)

    @post("/engines/{engine_id:str}/remove", status_code=303, **common, guards=[auth.admin_guard])
    async def remove_engine(core: Core, engine_id: FromPath[str]) -> Redirect:
        await core.engines.remove(engine_id)
        return Redirect("/engines", status_code=303)

    @get("/login", **common)
    async def login_page(request: Request, next: FromQuery[str | None] = None) -> Response[str]:
        return html("login.html", request, next=auth.safe_next(next), error=None)

    @post("/login", status_code=303, **common)
    async def login(request: Request, state: State, data: Form) -> Response[str] | Redirect:
        target = auth.safe_next(data.get("next"))
        if not auth.sign_in(request, str(data.get("token", "")), state.admin_token):
            return html("login.html", request, 401, next=target, error="that is not the admin token")
        return Redirect(target, status_code=303)

    @post("/logout", status_code=303, **common)
    async def logout(request: Request) -> Redirect:
        auth.sign_out(request)
        return Redirect("/", status_code=303)

    # -- live parts (SSE) -------------------------------------------------------------
    # ``/live/sessions`` has a handler of its own: ``/live/sessions/{session_id}`` makes
    # "sessions" a fixed path segment, which ``/live/{page}`` then never matches (a 404).
    @get("/live/{page:str}", **common, guards=[read])
    async def live_page(request: Request, core: Core, page: FromPath[str]) -> ServerSentEvent:
        ops = core.views
        renders = {
            "overview": lambda: fragment("live/overview.html", model=views.overview(ops)),
            "contexts": lambda: fragment("live/contexts.html", trees=views.context_trees(ops)),
            "engines": lambda: fragment(
                "live/engines.html",
                rows=views.engine_rows(ops),
                admin=auth.is_admin(request),
                csrf=auth.csrf_token(request),
                csrf_field=auth.CSRF_FIELD,
            ),
        }
        if page not in renders:
            raise HTTPException(status_code=404, detail=f"no live page {page!r}")
        return live.stream(renders[page], config)

    @get("/live/sessions", **common, guards=[read])
    async def live_sessions(core: Core) -> ServerSentEvent:
        ops = core.views
        return live.stream(lambda: fragment("live/sessions.html", model=views.session_list(ops)), config)

    @get("/live/sessions/{session_id:str}", **common, guards=[read])
    async def live_session(
        core: Core, session_id: FromPath[str], node: FromQuery[str | None] = None
    ) -> ServerSentEvent:
        ops = core.views
        ops.session_dag(session_id)  # 404 now, rather than an empty stream

        def render() -> str:
            return fragment("live/session.html", model=views.session_page(ops, session_id, node))

        return live.stream(render, config)

    pages = [
        overview_page,
        sessions_page,
        session_page,
        contexts_page,
        engines_page,
        register_engine,
        remove_engine,
        login_page,
        login,
        logout,
        live_page,
        live_sessions,
        live_session,
    ]
    static = create_static_files_router(path="/static", directories=[STATIC], name="dashboard-static")
    return [*pages, static]
