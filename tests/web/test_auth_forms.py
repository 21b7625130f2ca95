"""Sign-in, CSRF and the registration form over HTTP, on a real app (no engine needed):
admin actions without sign-in or without the CSRF token are refused, bad input is shown
next to its field and registers nothing, and ``require_sign_in`` closes the pages."""

from __future__ import annotations

import re

import httpx
import pytest
from conftest import ServerThread
from httpx_sse import connect_sse

from parrot.platform.serve.core import ServeCore
from parrot.web import auth, forms
from parrot.web.app import create_server_app
from parrot.web.config import DashboardConfig

ADMIN = "dash-admin"


def csrf(page: str) -> str:
    return re.search(r'name="_csrf_token" value="([^"]+)"', page).group(1)


def field_error(page: str, name: str) -> str | None:
    found = re.search(rf'<p class="field-error" id="error-{name}"[^>]*>([^<]*)</p>', page)
    return found.group(1) if found else None


@pytest.fixture(scope="module")
def server():
    with ServerThread(create_server_app(ServeCore(), admin_token=ADMIN)) as running:
        yield running


@pytest.fixture
def browser_like(server):
    """A fresh cookie jar (a new visitor)."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def sign_in(client: httpx.Client, token: str = ADMIN) -> httpx.Response:
    token_field = csrf(client.get("/login").text)
    return client.post("/login", data={"token": token, "next": "/engines", "_csrf_token": token_field})


def test_pages_render_and_are_open_on_loopback(browser_like):
    for path in ("/", "/sessions", "/contexts", "/engines", "/login"):
        r = browser_like.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), path
        assert '<nav aria-label="pages">' in r.text
    assert browser_like.get("/sessions/nope").status_code == 404
    assert browser_like.get("/static/htmx.min.js").status_code == 200
    assert browser_like.get("/static/sse.js").status_code == 200


def test_admin_actions_need_sign_in_and_csrf(browser_like):
    body = {"kind": "builtin", "url": "http://127.0.0.1:9"}
    # No CSRF token at all: refused by the CSRF check.
    assert browser_like.post("/engines", data=body).status_code == 403
    # A valid CSRF token but not signed in: refused, nothing registered.
    token = csrf(browser_like.get("/login").text)
    r = browser_like.post("/engines", data={**body, "_csrf_token": token})
    assert r.status_code == 401 and "sign in" in r.text
    assert browser_like.post("/engines/engine-1/remove", data={"_csrf_token": token}).status_code == 401
    # Signed in, but the form lacks the token (a cross-site form): refused.
    assert sign_in(browser_like).status_code == 303
    assert browser_like.post("/engines", data=body).status_code == 403
    assert browser_like.post("/engines", data={**body, "_csrf_token": "forged"}).status_code == 403
    assert browser_like.post("/logout", data={}).status_code == 403
    assert browser_like.get("/v1/engines").json() == []


def test_sign_in_cookie_is_httponly_and_sign_out_ends_it(browser_like):
    r = sign_in(browser_like, "wrong")
    assert r.status_code == 401 and field_error(r.text, "token")
    r = sign_in(browser_like)
    assert r.status_code == 303 and r.headers["location"] == "/engines"
    cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith(auth.SESSION_COOKIE))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and ADMIN not in cookie
    page = browser_like.get("/engines").text
    assert "Sign out" in page and 'action="/engines"' in page
    r = browser_like.post("/logout", data={"_csrf_token": csrf(page)})
    assert r.status_code == 303
    assert "Sign out" not in browser_like.get("/engines").text
    # A sign-in may only send the browser to this site.
    token = csrf(browser_like.get("/login").text)
    r = browser_like.post("/login", data={"token": ADMIN, "next": "//evil.example/x", "_csrf_token": token})
    assert r.headers["location"] == "/"


def test_invalid_form_input_is_shown_inline_and_registers_nothing(browser_like):
    sign_in(browser_like)
    token = csrf(browser_like.get("/engines").text)
    r = browser_like.post("/engines", data={"kind": "builtin", "url": "not a url", "_csrf_token": token})
    assert r.status_code == 422 and field_error(r.text, "url")
    assert 'value="not a url"' in r.text  # kept for fixing
    r = browser_like.post(
        "/engines",
        data={
            "kind": "openai",
            "base_url": "",
            "api_key": "sk-secret-123",
            "capacity": "0",
            "_csrf_token": token,
        },
    )
    assert r.status_code == 422
    assert (
        field_error(r.text, "base_url") and field_error(r.text, "model") and field_error(r.text, "capacity")
    )
    assert "sk-secret-123" not in r.text  # the key is never shown again
    # Valid, but nothing answers there: the reason is shown at the URL.
    r = browser_like.post(
        "/engines", data={"kind": "builtin", "url": "http://127.0.0.1:9", "_csrf_token": token}
    )
    assert r.status_code == 400 and "could not reach" in field_error(r.text, "url")
    assert browser_like.get("/v1/engines").json() == []


def test_the_rest_api_needs_no_csrf_token(browser_like):
    assert browser_like.post("/v1/session").status_code == 201


def test_require_sign_in_closes_the_read_only_pages():
    app = create_server_app(ServeCore(), admin_token=ADMIN, dashboard=DashboardConfig(require_sign_in=True))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.get("/sessions")
        assert r.status_code == 303 and r.headers["location"] == "/login?next=/sessions"
        assert client.get("/live/overview").status_code == 401
        assert client.get("/login").status_code == 200
        assert sign_in(client).status_code == 303
        assert client.get("/sessions").status_code == 200


def test_no_dashboard_serves_the_api_only():
    app = create_server_app(ServeCore(), admin_token=ADMIN, dashboard=DashboardConfig(enabled=False))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/").status_code == 404
        assert client.get("/healthz").status_code == 200


def test_loopback_addresses():
    assert auth.is_loopback("127.0.0.1") and auth.is_loopback("::1") and auth.is_loopback("127.8.0.1")
    assert not auth.is_loopback("10.0.0.1") and not auth.is_loopback(None) and not auth.is_loopback("x")


def test_form_parsing():
    ok = forms.parse({"kind": "builtin", "url": " http://127.0.0.1:9001 ", "capacity": "8"})
    assert ok.spec is not None and ok.spec.url == "http://127.0.0.1:9001" and ok.spec.capacity == 8
    openai = forms.parse(
        {"kind": "openai", "base_url": "https://api.example/v1", "model": "m", "api_key": "k"}
    )
    assert openai.spec is not None and openai.spec.api_key == "k" and openai.spec.api == "chat"
    assert "api_key" not in openai.values
    assert forms.parse({"kind": "gpu"}).errors["kind"]
    assert forms.parse({"kind": "builtin", "url": "http://h:99999"}).errors["url"]
    assert forms.parse({"kind": "builtin", "url": "ftp://h"}).errors["url"]
    assert forms.parse({"kind": "openai", "base_url": "http://h", "model": "m", "api": "x"}).errors["api"]
    assert forms.parse({"kind": "builtin", "url": "http://h", "capacity": "many"}).errors["capacity"]


def test_live_parts_stream_html_fragments(browser_like):
    with connect_sse(browser_like, "GET", "/live/overview") as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        first = next(source.iter_sse())
    assert first.event == "update" and 'data-stat="sessions"' in first.data
    assert browser_like.get("/live/nothing").status_code == 404
    assert browser_like.get("/live/sessions/nope").status_code == 404


def test_the_live_session_list_streams(browser_like):
    """Issue 24, defect 5: ``/live/sessions/{session_id}`` made "sessions" a fixed path
    segment, so ``/live/{page}`` never matched ``/live/sessions`` and it answered 404."""
    with connect_sse(browser_like, "GET", "/live/sessions") as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        first = next(source.iter_sse())
    assert first.event == "update" and "data-count=" in first.data
