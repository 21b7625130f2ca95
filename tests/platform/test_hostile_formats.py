"""Hostile formats and values (issue 37): each defect's exact request, answered with a 4xx
while the server keeps answering others. On the fake engine: these never reach an engine."""

from __future__ import annotations

import threading

import httpx
import pytest
from rest import api_on_fake_engine, new_session  # noqa: F401  (the api fixture)


@pytest.mark.parametrize("how", ["create", "set"])
def test_a_catastrophic_regex_value_is_refused_without_stalling_the_server(api, how):
    """Issue 37 (1): a value that makes a regex backtrack for seconds was matched on the
    event loop, twice (``/healthz`` waited 5.2 s). It is matched once, in a worker thread
    that releases the GIL, within its time bound; the server answers meanwhile."""
    sid, auth = new_session(api)
    fmt, value = {"regex": "(a|aa)+$"}, "a" * 5000 + "b"
    var_id = None
    if how == "set":
        body = {"session_id": sid, "name": "later", "format": fmt}
        var_id = api.post("/v1/semantic_var", json=body, headers=auth).json()["var_id"]
    answered: list[httpx.Response] = []

    def hostile() -> None:
        if var_id is None:
            body = {"session_id": sid, "name": "now", "value": value, "format": fmt}
            answered.append(api.post("/v1/semantic_var", json=body, headers=auth))
        else:
            body = {"session_id": sid, "value": value}
            answered.append(api.put(f"/v1/semantic_var/{var_id}", json=body, headers=auth))

    worker = threading.Thread(target=hostile)
    worker.start()
    healthy_meanwhile = 0
    with httpx.Client(base_url=api.base_url, timeout=30) as other:
        while worker.is_alive():
            if other.get("/healthz").status_code == 200 and worker.is_alive():
                healthy_meanwhile += 1
    worker.join()
    (r,) = answered
    assert r.status_code == 400 and "regex" in r.json()["error"]["message"], r.text
    assert healthy_meanwhile >= 3, "the server did not answer while it matched the value"
