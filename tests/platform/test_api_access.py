"""Who may do what over the REST API (session tokens, the admin token for engines), and
the Prometheus metrics."""

from __future__ import annotations

import httpx
from conftest import ServerThread
from prometheus_client.parser import text_string_to_metric_families
from rest import api_on_fake_engine, new_session, out  # noqa: F401  (the api fixture)

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.sdk.results import parse_metrics


def test_auth_and_cross_session_access(api):
    sid, auth = new_session(api)
    other, other_auth = new_session(api)
    var = api.post(
        "/v1/semantic_var", json={"session_id": sid, "name": "x", "value": "1"}, headers=auth
    ).json()
    r = api.get(f"/v1/session/{sid}")
    assert r.status_code == 401 and "Authorization" in r.json()["error"]["message"]
    r = api.get(f"/v1/session/{sid}", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 403
    r = api.get(f"/v1/session/{sid}", headers=other_auth)
    assert r.status_code == 403
    r = api.get(f"/v1/semantic_var/{var['var_id']}", params={"session_id": other}, headers=other_auth)
    assert r.status_code == 404 and "does not exist in session" in r.json()["error"]["message"]
    assert api.get("/v1/session/nope", headers=auth).status_code == 404


def test_engine_registry_needs_the_admin_token(fake_engine):
    core_app = create_app(ServeCore(), admin_token="s3cret")
    with ServerThread(core_app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.get("/v1/engines").json() == []
        body = {"url": fake_engine.url, "capacity": 4}
        assert c.post("/v1/engines", json=body).status_code == 401
        assert c.post("/v1/engines", json=body, headers={"Authorization": "Bearer nope"}).status_code == 403
        admin = {"Authorization": "Bearer s3cret"}
        r = c.post("/v1/engines", json=body, headers=admin)
        assert r.status_code == 201 and r.json()["up"] and r.json()["capacity"] == 4
        assert c.post("/v1/engines", json=body, headers=admin).status_code == 409
        r = c.post("/v1/engines", json={"url": "http://127.0.0.1:1"}, headers=admin)
        assert r.status_code == 400 and "could not reach" in r.json()["error"]["message"]
        assert c.post("/v1/engines", json={"url": "ftp://x"}, headers=admin).status_code == 400
        (engine,) = c.get("/v1/engines").json()
        assert "s3cret" not in c.get("/v1/engines").text
        assert c.delete(f"/v1/engines/{engine['engine_id']}", headers=admin).status_code == 204
        assert c.delete(f"/v1/engines/{engine['engine_id']}", headers=admin).status_code == 404
        assert c.get("/v1/engines").json() == []


def test_metrics_are_prometheus_text(api):
    for _ in range(2):  # two sessions: the second finds " now: " (after its own var) tokenized
        sid, auth = new_session(api)
        call = api.post(
            "/v1/semantic_call",
            headers=auth,
            json={
                "session_id": sid,
                "template": "Say {{w}} now: {{a}}",
                "parameters": [{"name": "w", "value": "yes"}, out("a", 2)],
            },
        ).json()
        api.get(f"/v1/semantic_var/{call['outputs']['a']}", params={"session_id": sid}, headers=auth)
    r = api.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    # prometheus_client's own parser reads it; the distributions are histograms
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    hists = ("task", "sv_wait", "time_to_first_token", "time_per_output_token")
    assert all(families[f"parrot:{name}_seconds"].type == "histogram" for name in hists)
    values = parse_metrics(r.text)
    done = values['parrot:tasks_total{state="done"}']
    assert done >= 1 and values["parrot:task_seconds_count"] == done
    assert values['parrot:task_seconds_bucket{le="+Inf"}'] == done
    assert values["parrot:sv_wait_seconds_count"] >= 1
    assert values['parrot:tokenizer_cache_total{result="hit"}'] >= 1
    assert any(k.startswith("parrot:engine_up{") and v == 1 for k, v in values.items())
