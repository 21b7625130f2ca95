"""Transforms over the REST API: derived variables inside the DAG, bad transforms, and a
transform that fails its variable and its consumers."""

from __future__ import annotations

import pytest
from rest import api_on_fake_engine, new_session, out  # noqa: F401  (the api fixture)


def test_transforms_derive_variables_inside_the_dag(api):
    """An LLM output goes through a transform on the server, and the result feeds the next
    call: still one submission and one final get."""
    sid, auth = new_session(api)
    first = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={"session_id": sid, "template": "Name a fruit: {{fruit}}", "parameters": [out("fruit", 6)]},
    ).json()
    shout = api.post(
        "/v1/semantic_transform",
        headers=auth,
        json={
            "session_id": sid,
            "inputs": [{"value": "FRUIT:"}, {"var_id": first["outputs"]["fruit"]}],
            "steps": [{"type": "strip"}, {"type": "upper"}, {"type": "join", "separator": " "}],
            "output": "loud",
        },
    )
    assert shout.status_code == 201, shout.text
    loud = shout.json()["outputs"]["loud"]
    last = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": "Repeat: {{loud}}\nAgain: {{again}}",
            "parameters": [{"name": "loud", "var_id": loud}, out("again", 4)],
        },
    ).json()
    final = api.get(f"/v1/semantic_var/{last['outputs']['again']}", params={"session_id": sid}, headers=auth)
    assert final.json()["ready"]
    fruit = api.get(f"/v1/semantic_var/{first['outputs']['fruit']}", params={"session_id": sid}, headers=auth)
    value = api.get(f"/v1/semantic_var/{loud}", params={"session_id": sid}, headers=auth).json()["value"]
    assert value == "FRUIT: " + fruit.json()["value"].strip().upper()
    info = api.get(f"/v1/semantic_call/{shout.json()['call_id']}", params={"session_id": sid}, headers=auth)
    assert info.json()["state"] == "done" and info.json()["engine"] == "servecore"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"inputs": [], "steps": [{"type": "lower"}]}, 400, "inputs"),
        ({"inputs": [{"value": "a"}], "steps": [{"type": "eval", "code": "1"}]}, 400, "eval"),
        ({"inputs": [{"value": "a"}], "steps": [{"type": "regex", "pattern": "("}]}, 400, "invalid regex"),
        (
            {"inputs": [{"value": "a", "var_id": "var-1"}], "steps": [{"type": "lower"}]},
            400,
            "var_id or a value",
        ),
        ({"inputs": [{"var_id": "var-404"}], "steps": [{"type": "lower"}]}, 404, "does not exist"),
    ],
)
def test_bad_transforms_get_clear_errors(api, body, status, message):
    sid, auth = new_session(api)
    r = api.post("/v1/semantic_transform", headers=auth, json={"session_id": sid, **body})
    assert r.status_code == status and message in r.json()["error"]["message"], r.text
    assert api.get(f"/v1/session/{sid}", headers=auth).json()["vars"] == []


def test_a_transform_that_fails_fails_its_variable_and_its_consumers(api):
    sid, auth = new_session(api)
    bad = api.post(
        "/v1/semantic_transform",
        headers=auth,
        json={
            "session_id": sid,
            "inputs": [{"value": "no digits here"}],
            "steps": [{"type": "regex", "pattern": r"\d+"}],
        },
    ).json()
    after = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": "Number {{n}}: {{x}}",
            "parameters": [{"name": "n", "var_id": bad["outputs"]["result"]}, out("x")],
        },
    ).json()
    r = api.get(f"/v1/semantic_var/{after['outputs']['x']}", params={"session_id": sid}, headers=auth)
    assert r.status_code >= 400 and "did not match" in r.json()["error"]["message"], r.text
    state = api.get(f"/v1/semantic_call/{bad['call_id']}", params={"session_id": sid}, headers=auth).json()
    assert state["state"] == "failed" and "did not match" in state["error"]
