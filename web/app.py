"""The dashboard's routes, and the ServeCore's whole app: the API's Litestar app with them
(:func:`create_server_app`).

Pages: ``/`` (overview), ``/sessions`` (``?q=``: a search by label or tag),
``/sessions/{id}``, ``/requests`` (the OpenAI front's recent requests; ``?q=``),
``/requests/{id}``, ``/contexts``, ``/engines``; their live parts at ``/live/...`` (SSE);
``/login``, ``/logout``; forms ``POST /engines`` and ``POST /engines/{id}/remove`` (after
its confirmation page, ``GET`` the same path); htmx and the favicon under ``/static``
(``/favicon.ico`` too, where browsers look first). Every page is complete when rendered (it
works with JavaScript off); htmx only swaps in the live updates.

One controller per domain (pages, live parts, engine forms, sign-in), each declaring its
path and guards once; every handler gets the ServeCore as the API's ``core`` dependency
(:mod:`parrot.platform.api.deps`). The controllers sit in one Router (:func:`dashboard_routes`)
that holds what they share: the cookie session and CSRF middleware, the error pages, the
dashboard's settings (``opt``) and staying out of the OpenAPI schema.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from litestar import Controller, Litestar, Request, Response, Router, get, post
from litestar.datastructures import State
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException
from litestar.params import Body, FromPath, FromQuery
from litestar.response import File, Redirect, ServerSentEvent
from litestar.static_files import create_static_files_router

from parrot.engines.protocol.errors import ParrotError, TooManyRequestsError
from parrot.platform.api.app import create_app
from parrot.platform.api.auth import check_admin_token
from parrot.platform.api.deps import Core
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.ops.views import OperatorViews
from parrot.web import auth, forms, live, render, views
from parrot.web.auth import Dashboard
from parrot.web.config import DashboardConfig

STATIC = Path(__file__).parent / "static"
Form = Annotated[dict[str, Any], Body(media_type=RequestEncodingType.URL_ENCODED)]


class PageController(Controller):
    """The read-only pages: open on loopback, or to the signed-in admin (``read_guard``)."""

    path = "/"
    guards = (auth.read_guard,)

    @get("/")
    async def overview_page(self, request: Request, core: Core) -> Response[str]:
        return render.page("overview.html", request, model=views.overview(core.views))

    @get("/sessions")
    async def sessions_page(
        self, request: Request, core: Core, q: FromQuery[str | None] = None
    ) -> Response[str]:
        return render.page("sessions.html", request, model=views.session_list(core.views, q))

    @get("/sessions/{session_id:str}")
    async def session_page(
        self, request: Request, core: Core, session_id: FromPath[str], node: FromQuery[str | None] = None
    ) -> Response[str]:
        snapshot = views.session_snapshot(core.views, session_id, node)  # on the loop, bounded
        model = await asyncio.to_thread(views.session_page, snapshot, node)  # drawn off it
        live_url = f"/live/sessions/{quote(session_id)}" + (f"?node={quote(node)}" if node else "")
        return render.page("session.html", request, model=model, live_url=live_url)

    @get("/requests")
    async def requests_page(
        self, request: Request, core: Core, q: FromQuery[str | None] = None
    ) -> Response[str]:
        return render.page("requests.html", request, model=views.request_list(core.views, q))

    @get("/requests/{request_id:str}")
    async def request_page(self, request: Request, core: Core, request_id: FromPath[str]) -> Response[str]:
        """One request's record: it is written once, when the request ends, so the page is
        not live."""
        return render.page("request.html", request, record=core.views.request_record(request_id))

    @get("/contexts")
    async def contexts_page(self, request: Request, core: Core) -> Response[str]:
        return render.page("contexts.html", request, trees=views.context_trees(core.views))

    @get("/engines")
    async def engines_page(self, request: Request, core: Core) -> Response[str]:
        return render.page(
            "engines.html", request, rows=views.engine_rows(core.views), form=forms.EngineForm()
        )


def _engines_with(request: Request, ops: OperatorViews, form: forms.EngineForm, status: int) -> Response[str]:
    """The engines page again, with the submitted form and its errors."""
    return render.page("engines.html", request, status, rows=views.engine_rows(ops), form=form)


class EngineFormController(Controller):
    """The admin's forms on the engines page: a signed-in admin only (``admin_guard``), and
    the CSRF token (the Router's middleware)."""

    path = "/engines"
    guards = (auth.admin_guard,)

    @post(status_code=303)
    async def register_engine(self, request: Request, core: Core, data: Form) -> Response[str] | Redirect:
        form = forms.parse(data)
        if form.spec is None:
            return _engines_with(request, core.views, form, 422)
        try:
            slot = await core.engines.register(form.spec)
        except ParrotError as error:
            code = error.status_code if 400 <= error.status_code < 500 else 400
            return _engines_with(
                request, core.views, form.with_error(forms.target_field(form), str(error)), code
            )
        view = core.views.engine_view(slot.engine_id)
        render.notify(request, f"Registered {view.engine_id}: {view.model or 'its model'} at {view.url}.")
        return Redirect("/engines", status_code=303)

    @get("/{engine_id:str}/remove")
    async def confirm_removal(self, request: Request, core: Core, engine_id: FromPath[str]) -> Response[str]:
        """The confirmation step (a page: it works without JavaScript)."""
        view = core.views.engine_view(engine_id)  # 404 when it is not there
        others = [v for v in core.views.engine_views() if v.engine_id != engine_id]
        return render.page("engine_remove.html", request, engine=view, others=len(others))

    @post("/{engine_id:str}/remove", status_code=303)
    async def remove_engine(self, request: Request, core: Core, engine_id: FromPath[str]) -> Redirect:
        await core.engines.remove(engine_id)
        render.notify(request, f"Removed {engine_id}.")
        return Redirect("/engines", status_code=303)


class SignInController(Controller):
    """Signing in with the admin token (the app's ``admin_token``) and out; open to all."""

    path = "/"

    @get("/login")
    async def login_page(self, request: Request, next: FromQuery[str | None] = None) -> Response[str]:
        return render.page("login.html", request, next=auth.safe_next(next), error=None)

    @post("/login", status_code=303)
    async def login(self, request: Request, state: State, data: Form) -> Response[str] | Redirect:
        target = auth.safe_next(data.get("next"))
        try:
            right = check_admin_token(request, str(data.get("token", "")))
        except TooManyRequestsError as error:
            return render.page("login.html", request, 429, next=target, error=str(error))
        if not right or not auth.sign_in(request, str(data.get("token", "")), state.admin_token):
            return render.page("login.html", request, 401, next=target, error="that is not the admin token")
        return Redirect(target, status_code=303)

    @post("/logout", status_code=303)
    async def logout(self, request: Request) -> Redirect:
        auth.sign_out(request)
        return Redirect("/", status_code=303)


def _live_engines(ops: OperatorViews, request: Request) -> str:
    return render.fragment(
        "live/engines.html",
        rows=views.engine_rows(ops),
        admin=auth.is_admin(request),
        csrf=auth.csrf_token(request),
        csrf_field=auth.CSRF_FIELD,
    )


def _live_requests(ops: OperatorViews, request: Request) -> str:
    return render.fragment("live/requests.html", model=views.request_list(ops, request.query_params.get("q")))


LIVE_PAGES: dict[str, Callable[[OperatorViews, Request], str]] = {
    "overview": lambda ops, _: render.fragment("live/overview.html", model=views.overview(ops)),
    "requests": _live_requests,
    "contexts": lambda ops, _: render.fragment("live/contexts.html", trees=views.context_trees(ops)),
    "engines": _live_engines,
}


def _draw_sessions(model: views.SessionList) -> str:
    return render.fragment("live/sessions.html", model=model)


def _draw_session(snapshot: views.SessionSnapshot, node: str | None) -> str:
    return render.fragment("live/session.html", model=views.session_page(snapshot, node))


class LiveController(Controller):
    """The pages' live parts as SSE streams (:mod:`parrot.web.live`), under the pages' guard.

    ``/live/sessions`` has a handler of its own: ``/live/sessions/{session_id}`` makes
    "sessions" a fixed path segment, which ``/live/{page}`` then never matches (a 404)."""

    path = "/live"
    guards = (auth.read_guard,)
    dependencies = auth.DEPENDENCIES

    @get("/{page:str}")
    async def live_page(
        self, request: Request, core: Core, dashboard: Dashboard, page: FromPath[str]
    ) -> ServerSentEvent:
        if page not in LIVE_PAGES:
            raise HTTPException(status_code=404, detail=f"no live page {page!r}")
        return live.stream(partial(LIVE_PAGES[page], core.views, request), dashboard)

    # The session pages can be big: their renders are shared by every tab and drawn off the
    # event loop (live.SharedRenders).
    @get("/sessions")
    async def live_sessions(
        self, request: Request, core: Core, dashboard: Dashboard, q: FromQuery[str | None] = None
    ) -> ServerSentEvent:
        shared = live.renders(request)
        snapshot = partial(views.session_list, core.views, q)
        key = ("sessions", (q or "").strip())  # one render per search, shared by its tabs
        render_once = partial(shared.get, key, snapshot, _draw_sessions, dashboard.live_interval_s)
        return live.stream(render_once, dashboard)

    @get("/sessions/{session_id:str}")
    async def live_session(
        self,
        request: Request,
        core: Core,
        dashboard: Dashboard,
        session_id: FromPath[str],
        node: FromQuery[str | None] = None,
    ) -> ServerSentEvent:
        core.views.session_dag(session_id, latest=1)  # the 404 now, rather than in the stream
        shared = live.renders(request)
        snapshot = partial(views.session_snapshot, core.views, session_id, node)
        draw = partial(_draw_session, node=node)
        key = ("session", session_id, node)
        return live.stream(partial(shared.get, key, snapshot, draw, dashboard.live_interval_s), dashboard)


# -- errors as pages ------------------------------------------------------------------
def not_signed_in(request: Request, error: auth.NotSignedIn) -> Response:
    if request.method == "GET" and not request.url.path.startswith("/live/"):
        target = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        return Redirect(f"/login?next={target}", status_code=303)
    return render.page("error.html", request, 401, message=str(error), status=401)


def parrot_error(request: Request, error: ParrotError) -> Response:
    status = error.status_code if 400 <= error.status_code < 600 else 500
    return render.page("error.html", request, status, message=str(error), status=status)


def http_error(request: Request, error: HTTPException) -> Response:
    return render.page(
        "error.html", request, error.status_code, message=error.detail, status=error.status_code
    )


ERROR_PAGES = {auth.NotSignedIn: not_signed_in, ParrotError: parrot_error, HTTPException: http_error}


def dashboard_routes(config: DashboardConfig) -> list[Router]:
    """The dashboard's Router for one app (its own session and CSRF secrets) and its static
    files (no session there)."""
    pages = Router(
        path="/",
        route_handlers=[PageController, EngineFormController, SignInController, LiveController],
        middleware=auth.middleware(config),
        exception_handlers=ERROR_PAGES,
        opt={auth.CONFIG: config, live.RENDERS: live.SharedRenders()},
        include_in_schema=False,
    )
    static = create_static_files_router(path="/static", directories=[STATIC], name="dashboard-static")
    return [pages, static, favicon]


@get("/favicon.ico", include_in_schema=False, cache=86400)
async def favicon() -> File:
    """Browsers ask for ``/favicon.ico`` whatever the page links: the same small SVG."""
    return File(STATIC / "favicon.svg", media_type="image/svg+xml", content_disposition_type="inline")


def create_server_app(
    core: ServeCore,
    engine_urls: tuple[str, ...] = (),
    admin_token: str | None = None,
    openai_api_keys: tuple[str, ...] = (),
    dashboard: DashboardConfig | None = None,
    own_engine: str | None = None,
) -> Litestar:
    """The ServeCore's whole HTTP app, as ``parrot serve`` runs it: the Parrot API
    (:func:`parrot.platform.api.app.create_app`) and the dashboard's pages beside it (none
    when ``dashboard.enabled`` is False). The API knows nothing of the dashboard: the
    dashboard is layered on top of it, never the other way."""
    dashboard = dashboard or DashboardConfig()
    pages = dashboard_routes(dashboard) if dashboard.enabled else []
    return create_app(core, engine_urls, admin_token, openai_api_keys, own_engine, pages)
