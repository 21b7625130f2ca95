"""Requests that used to get a 500 from the ServeCore get a clear 4xx JSON error (issue 14,
items 5 and 7): bodies nested 10^4 deep or with invalid UTF-8 on every JSON route, JSON sent
as text/plain, engine URLs that do not parse, non-ASCII bearer tokens. After each, the
server is healthy and a normal request still works."""

from __future__ import annotations

import os

import httpx
import pytest
from bad_bodies import assert_bad_bodies_rejected, assert_error
from conftest import ADMIN_TOKEN, ServerThread

from parrot.platform.api.app import create_app
from parrot.platform.api.auth import same_secret
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url


def new_session(client: httpx.Client) -> tuple[str, dict]:
    body = client.post("/v1/session").json()
    return body["session_id"], {"Authorization": f"Bearer {body['session_auth']}"}


@pytest.fixture
def api(parrot_url):
    """The ``parrot serve`` process of the shared fixtures (its admin token is ADMIN_TOKEN)."""
    with httpx.Client(base_url=parrot_url, timeout=60) as client:
        yield client


def test_every_json_route_rejects_deep_nesting_bad_utf8_and_non_json_types(api):
    _, auth = new_session(api)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    routes = assert_bad_bodies_rejected(api, lambda path: admin if "engines" in path else auth, "/healthz")
    assert routes >= 8  # var, set var, call, transform, engines, completions, chat, render_chat


def test_a_valid_body_sent_as_text_plain_changes_nothing(api):
    sid, auth = new_session(api)
    body = b'{"session_id": "%s", "name": "v", "value": "hello"}' % sid.encode()
    r = api.post("/v1/semantic_var", content=body, headers={**auth, "content-type": "text/plain"})
    assert_error(r, 415, "Content-Type: application/json")
    assert api.get(f"/v1/session/{sid}", headers=auth).json()["vars"] == []
    # the same body as JSON (with a charset, as some clients send it) is taken
    json_type = {**auth, "content-type": "application/json; charset=utf-8"}
    assert api.post("/v1/semantic_var", content=body, headers=json_type).status_code == 201


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:port", "Port could not be cast"),
        ("http://127.0.0.1\x01:9001", "non-printable"),
        ("ftp://127.0.0.1:9001", "http:// or https://"),
    ],
)
def test_register_engine_with_a_url_that_does_not_parse(api, url, fragment):
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    registered = lambda: [(e["engine_id"], e["url"]) for e in api.get("/v1/engines").json()]  # noqa: E731
    before = registered()  # not the engines' load: it changes with every ping
    assert_error(api.post("/v1/engines", json={"url": url}, headers=admin), 400, "engine url", fragment)
    assert registered() == before
    assert api.get("/healthz").json()["status"] == "ok"


def test_non_ascii_bearer_token_on_admin_and_session_routes(api):
    for token in ("Bearer \u00fcber".encode(), b"Bearer \xff\xfe", "Bearer 令牌".encode()):
        r = api.post("/v1/engines", json={"url": "http://127.0.0.1:1"}, headers={"Authorization": token})
        assert_error(r, 403, "wrong admin token")
        sid, _ = new_session(api)
        assert_error(api.get(f"/v1/session/{sid}", headers={"Authorization": token}), 403, "session_auth")
    assert api.get("/healthz").status_code == 200


@pytest.fixture(scope="module")
def keyed_front(tmp_path_factory):
    """A ServeCore whose OpenAI front needs an API key (``--openai-api-key``); the key check
    comes before any engine is needed, so none is registered."""
    core = ServeCore(store=Store(sqlite_url(tmp_path_factory.mktemp("keyed-db"))))
    app = create_app(core, openai_api_keys=("sk-pärrot", "plain-key"))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def test_non_ascii_bearer_token_on_the_openai_front(keyed_front):
    body = {"prompt": "Hi", "max_tokens": 2}
    for token in ("Bearer \u00fcber".encode(), b"Bearer \xff", "Bearer sk-pärrot!".encode()):
        headers = {"Authorization": token}
        assert_error(keyed_front.post("/v1/completions", json=body, headers=headers), 403, "unknown API key")
        assert_error(keyed_front.get("/v1/models", headers=headers), 403, "unknown API key")
    # a configured non-ASCII key is accepted (its UTF-8 bytes on the wire)
    assert (
        keyed_front.get("/v1/models", headers={"Authorization": "Bearer sk-pärrot".encode()}).status_code
        == 200
    )
    assert keyed_front.get("/v1/models", headers={"Authorization": "Bearer plain-key"}).status_code == 200


def test_a_call_naming_only_models_nobody_serves_is_a_404(api):
    sid, auth = new_session(api)
    out = {"name": "a", "is_output": True, "sampling": {"max_tokens": 2}}
    body = {"session_id": sid, "template": "Q: {{a}}", "parameters": [out], "models": ["no-such-model"]}
    r = api.post("/v1/semantic_call", json=body, headers=auth)
    assert_error(r, 404, "no registered engine serves the 1 model(s) asked for")
    assert r.json()["error"]["code"] == "unknown_model"
    assert api.get(f"/v1/session/{sid}", headers=auth).json()["calls"] == []


def test_secrets_compare_as_the_bytes_sent():
    # header values arrive decoded as latin-1; configured secrets are text (argv and the
    # environment carry bytes that are not UTF-8 as surrogate escapes)
    assert same_secret("sk-pärrot".encode().decode("latin-1"), "sk-pärrot")
    assert same_secret("\xff", os.fsdecode(b"\xff"))
    assert not same_secret("sk-parrot", "sk-pärrot") and not same_secret("x", "\ud800")
