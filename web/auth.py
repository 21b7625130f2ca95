"""Who may use the dashboard: a signed cookie session for the admin, CSRF on every form.

Signing in takes the server's admin token (the one ``POST /v1/engines`` checks); it sets an
encrypted and authenticated, HttpOnly, SameSite=Strict cookie session (Litestar's
client-side session backend) that says "admin" and nothing else. Every POST of the
dashboard needs the CSRF token of Litestar's CSRF middleware (a hidden form field that
must match an HttpOnly cookie). Both secrets are made at start: restarting the server
signs everybody out.

The dashboard's settings (:class:`DashboardConfig`) travel on its Router's ``opt`` (the
per-layer options Litestar hands to guards), under :data:`CONFIG`; the guards below read
them there, and handlers take them as the ``dashboard`` dependency (:data:`DEPENDENCIES`).

The read-only pages are open to clients on the loopback interface unless
``require_sign_in``; from any other address they need signing in.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets

from litestar import Request
from litestar.config.csrf import CSRFConfig
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.handlers.base import BaseRouteHandler
from litestar.middleware import DefineMiddleware
from litestar.middleware.csrf import CSRFMiddleware
from litestar.middleware.session import SessionMiddleware
from litestar.middleware.session.client_side import ClientSideSessionBackend, CookieBackendConfig
from litestar.types import ASGIApp
from litestar.utils.scope.state import ScopeState

from parrot.web.config import DashboardConfig

SESSION_COOKIE = "parrot_dashboard"
CSRF_COOKIE = "parrot_csrf"
CSRF_FIELD = "_csrf_token"  # the form field Litestar's CSRF middleware reads
CONFIG = "dashboard"  # the key of the DashboardConfig in the dashboard Router's ``opt``


class NotSignedIn(Exception):
    """The request needs a signed-in admin (a page: sign in first; an action: refused)."""


def cookie_session(app: ASGIApp, config: CookieBackendConfig) -> SessionMiddleware:
    """The cookie session middleware, made when Litestar builds a route's middleware stack.

    Litestar deep-copies a Router when it is registered, middleware definitions included;
    the session backend's cipher cannot be copied, so the definition holds only the
    backend's config (``CookieBackendConfig.middleware`` would hold the backend itself)."""
    return SessionMiddleware(app=app, backend=ClientSideSessionBackend(config=config))


def middleware(config: DashboardConfig) -> list[DefineMiddleware]:
    """The cookie session and the CSRF check, for the dashboard's Router only (the REST API
    keeps its Bearer tokens). Its secrets are made here, once per app."""
    session = CookieBackendConfig(
        secret=secrets.token_bytes(32),
        key=SESSION_COOKIE,
        max_age=config.sign_in_max_age_s,
        httponly=True,
        samesite="strict",
        secure=config.secure_cookies,
    )
    csrf = CSRFConfig(
        secret=secrets.token_urlsafe(32),
        cookie_name=CSRF_COOKIE,
        cookie_httponly=True,
        cookie_samesite="strict",
        cookie_secure=config.secure_cookies,
    )
    return [DefineMiddleware(cookie_session, config=session), DefineMiddleware(CSRFMiddleware, config=csrf)]


def is_admin(request: ASGIConnection) -> bool:
    return request.session.get("admin") is True


def sign_in(request: Request, token: str, admin_token: str) -> bool:
    """Sign in when ``token`` is the admin token."""
    if not token or not hmac.compare_digest(token.encode(), admin_token.encode()):
        return False
    request.set_session({"admin": True})
    return True


def sign_out(request: Request) -> None:
    request.clear_session()


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def may_read(request: ASGIConnection, config: DashboardConfig) -> bool:
    if is_admin(request):
        return True
    return not config.require_sign_in and is_loopback(request.client.host if request.client else None)


def dashboard_config(handler: BaseRouteHandler) -> DashboardConfig:
    """The settings of the dashboard ``handler`` belongs to (its Router's ``opt``)."""
    return handler.opt[CONFIG]


def provide_config(request: Request) -> DashboardConfig:
    return dashboard_config(request.route_handler)


DEPENDENCIES = {"dashboard": Provide(provide_config, sync_to_thread=False)}
Dashboard = NamedDependency[DashboardConfig]  # a handler's ``dashboard`` parameter


def read_guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """A guard for the pages: a signed-in admin, or (unless sign-in is required) a loopback client."""
    if not may_read(connection, dashboard_config(handler)):
        raise NotSignedIn("sign in with the admin token to see this page")


def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """A guard for the admin actions: a signed-in admin only."""
    if not is_admin(connection):
        raise NotSignedIn("sign in with the admin token first")


def csrf_token(request: Request) -> str:
    """The CSRF token to put in this page's forms (set by the CSRF middleware)."""
    token = ScopeState.from_scope(request.scope).csrf_token
    return token if isinstance(token, str) else ""


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site only (never another host)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
