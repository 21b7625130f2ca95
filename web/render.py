"""The dashboard's Jinja environment (templates from ``web/templates``, autoescaped) and the
two ways a handler renders one: a whole page (with the sign-in state, the CSRF token its
forms need and a notice left for it) or a fragment (a live part).

A notice ("Registered engine-2 ...") is what a form's action says after its redirect: kept
in the admin's cookie session by :func:`notify` and shown once, by the next page."""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from litestar import MediaType, Request, Response

from parrot.web import auth
from parrot.web.words import plural

TEMPLATES = Path(__file__).parent / "templates"


def ago(ts: float | None) -> str:
    if ts is None:
        return "—"
    s = max(0.0, time.time() - ts)
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def clock(ts: float | None) -> str:
    return "—" if ts is None else time.strftime("%H:%M:%S", time.localtime(ts))


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def pretty_json(value: Any) -> str:
    """A format (a struct or its JSON) as indented JSON, for a ``<pre>``."""
    return json.dumps(msgspec.to_builtins(value), indent=2, ensure_ascii=False)


def format_kind(value: Any) -> str:
    """Which kind a format is (``json_schema``, ``regex``, ...), from a struct or its JSON."""
    data = msgspec.to_builtins(value)
    return next((k for k, v in data.items() if v not in (None, False)), "") if isinstance(data, dict) else ""


@cache
def environment() -> Environment:
    """One per process: the templates are read-only files, and Jinja renders concurrently."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ago=ago, seconds=seconds, clock=clock, percent=percent, plural=plural)
    env.filters.update(pretty_json=pretty_json, format_kind=format_kind)
    return env


NOTICE = "notice"  # the cookie session's key of the notice for the next page


def notify(request: Request, message: str) -> None:
    """Leave ``message`` for the next page this browser gets (after a form's redirect)."""
    request.session[NOTICE] = message


def _take_notice(request: Request) -> str | None:
    session = request.scope.get("session")  # a dict, where the cookie session middleware runs
    return session.pop(NOTICE, None) if isinstance(session, dict) else None


def page(template: str, request: Request, code: int = 200, **context: Any) -> Response[str]:
    jinja = environment().get_template(template)
    body = jinja.render(
        path=request.url.path,
        admin=auth.is_admin(request),
        csrf=auth.csrf_token(request),
        csrf_field=auth.CSRF_FIELD,
        notice=_take_notice(request),
        **context,
    )
    return Response(body, media_type=MediaType.HTML, status_code=code, headers={"Cache-Control": "no-store"})


def fragment(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
