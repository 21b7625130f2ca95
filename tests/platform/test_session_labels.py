"""Issue 38 §3: a session can be labelled so it can be found. ``POST /v1/session`` takes an
optional ``{"label", "tags"}`` body (no body keeps working), each bad one a 400 that says
what is wrong; a batch that opens its session takes the same; ``GET /v1/session/{id}``
returns them, they are stored with the session and back after a restart (SQLite and the
PostgreSQL tier); the operators' session list is searched by label or tag."""

from __future__ import annotations

import httpx
import pytest
from conftest import ServerThread

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store


@pytest.fixture
def api(fake_engine):
    core = ServeCore()
    app = create_app(core, engine_urls=(fake_engine.url,))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client, core


def opened(api: httpx.Client, **kwargs) -> tuple[str, dict]:
    answer = api.post("/v1/session", **kwargs)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    return body["session_id"], {"Authorization": f"Bearer {body['session_auth']}"}


def named(api: httpx.Client, sid: str, auth: dict) -> tuple[str | None, list[str]]:
    info = api.get(f"/v1/session/{sid}", headers=auth).json()
    return info["label"], info["tags"]


def test_a_session_is_made_with_a_label_and_tags_or_without(api):
    api, core = api
    sid, first = opened(api, json={"label": "Tide report, week 48", "tags": ["harbour", "daily", "harbour"]})
    assert named(api, sid, first) == ("Tide report, week 48", ["harbour", "daily"])  # a tag once
    empty = {"content": b"", "headers": {"content-type": "text/plain"}}
    for kwargs in ({}, {"json": None}, {"json": {}}, empty):
        plain, auth = opened(api, **kwargs)  # no body (or an empty one) keeps working
        assert named(api, plain, auth) == (None, [])
    only_tags, auth = opened(api, json={"tags": ["night-shift"]})
    assert named(api, only_tags, auth) == (None, ["night-shift"])

    # The operators' list finds them by label or tag, case aside, live or closed.
    found = lambda query: [s.session_id for s in core.views.session_summaries(query)]  # noqa: E731
    assert found("TIDE REPORT") == found("harbour") == [sid]
    assert found("night") == [only_tags]
    assert found("") == [s.session_id for s in core.views.session_summaries()] and len(found("")) == 6
    assert api.delete(f"/v1/session/{sid}", headers=first).status_code == 204
    (closed,) = core.views.session_summaries("week 48")
    assert (closed.session_id, closed.live) == (sid, False)
    assert (closed.label, closed.tags) == ("Tide report, week 48", ("harbour", "daily"))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"label": ""}, "Expected `str` of length >= 1 (label)"),
        ({"label": "x" * 201}, "Expected `str` of length <= 200 (label)"),
        ({"label": 7}, "Expected `str | null`, got `int` (label)"),
        ({"tags": [f"t{n}" for n in range(17)]}, "Expected `array` of length <= 16 (tags)"),
        ({"tags": ["ok", ""]}, "Expected `str` of length >= 1 (tags[1])"),
        ({"tags": ["y" * 65]}, "Expected `str` of length <= 64 (tags[0])"),
        ({"tags": "harbour"}, "Expected `array`, got `str` (tags)"),
        ({"name": "x"}, "unknown field `name`"),
        ({"label": "nul\u0000"}, "the label is not valid text: NUL character (U+0000) at character 3"),
        ({"tags": ["ok", "\u0000"]}, "tags[1] is not valid text: NUL character"),
        ([], "Expected `object | null`, got `array`"),
    ],
)
def test_each_bad_label_or_tag_is_a_400_that_says_what_is_wrong(api, body, message):
    api, core = api
    answer = api.post("/v1/session", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] in ("invalid_request", "bad_request")
    assert message in answer.json()["error"]["message"], answer.json()
    assert len(core.sessions) == 0  # nothing made


def test_a_batch_that_opens_its_session_labels_it(api):
    api, core = api
    out = {"name": "y", "is_output": True, "sampling": {"max_tokens": 2}}
    body = {"calls": [{"template": "Say hi: {{y}}", "parameters": [out]}]}
    answer = api.post("/v1/semantic_calls", json={**body, "label": "one batch", "tags": ["b"]})
    assert answer.status_code == 201, answer.text
    sid, auth = answer.json()["session_id"], {"Authorization": f"Bearer {answer.json()['session_auth']}"}
    assert named(api, sid, auth) == ("one batch", ["b"])
    refused = api.post("/v1/semantic_calls", json={**body, "session_id": sid, "tags": ["c"]}, headers=auth)
    assert refused.status_code == 400
    assert "'label' and 'tags' name the session a batch opens" in refused.json()["error"]["message"]
    bad = api.post("/v1/semantic_calls", json={**body, "label": "z" * 201})
    assert bad.status_code == 400 and "length <= 200 (label)" in bad.json()["error"]["message"]
    assert len(core.sessions) == 1 and named(api, sid, auth) == ("one batch", ["b"])


def test_labels_are_stored_and_back_after_a_restart(db_url):
    """On SQLite and on PostgreSQL: a second ServeCore on the same database."""

    def serve():
        return ServerThread(create_app(ServeCore(store=Store(db_url))))

    with serve() as server, httpx.Client(base_url=server.url, timeout=60) as api:
        sid, auth = opened(api, json={"label": "Lighthouse «Nord» ⚓", "tags": ["keeper=ana", "fog"]})
        plain, plain_auth = opened(api)
    with serve() as server, httpx.Client(base_url=server.url, timeout=60) as api:
        assert named(api, sid, auth) == ("Lighthouse «Nord» ⚓", ["keeper=ana", "fog"])
        assert named(api, plain, plain_auth) == (None, [])
