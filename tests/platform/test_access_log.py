"""The access log (engines/protocol/access_log.py; issue 38 §3): one line a request at info,
with method, route (its template: no ids), status, duration and bytes, and the tokens of an
OpenAI-front generation, streamed or not; health checks are not logged; ``--log-json`` gives
the same fields as keys. On the ServeCore with the fake engine, served over HTTP."""

from __future__ import annotations

import io
import json
import logging

import pytest
from rest import api_on_fake_engine, new_session  # noqa: F401  (the api fixture)

from parrot.cli.logs import configure_logging


@pytest.fixture
def access(caplog):
    caplog.set_level(logging.INFO, logger="parrot.access")
    return caplog


def lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "parrot.access"]


def test_each_request_is_one_line_with_its_route_status_and_duration(api, access):
    sid, auth = new_session(api)
    api.get("/healthz")
    api.get("/v1/semantic_var/var-nope", params={"session_id": sid}, headers=auth)
    records = lines(access)
    created = next(r for r in records if r.route == "/v1/session")
    assert (created.method, created.status) == ("POST", 201) and created.duration_ms > 0 and created.bytes > 0
    missing = next(r for r in records if r.status == 404)
    assert missing.method == "GET" and "{var_id" in missing.route and "var-nope" not in missing.route
    assert not [r for r in records if r.route == "/healthz"]  # health checks stay out
    assert "POST /v1/session 201" in created.getMessage()


@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_logs_its_tokens(api, access, stream):
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3, "stream": stream}
    r = api.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    (line,) = [x for x in lines(access) if x.route == "/v1/chat/completions"]
    assert line.prompt_tokens > 0 and line.completion_tokens == 3, line.__dict__
    assert f"{line.prompt_tokens}+3 tokens" in line.getMessage()


def test_log_json_gives_the_same_fields_as_keys(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("info", json_lines=True)
        fields = {"method": "GET", "route": "/v1/x", "status": 200, "duration_ms": 1.5, "bytes": 7}
        logging.getLogger("parrot.access").info("GET /v1/x 200 1.5 ms", extra=fields)
        for _ in range(20):  # not rate-limited like repeated warnings: a line a request
            logging.getLogger("parrot.access").info("GET /v1/x 200 1.5 ms", extra=fields)
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(records) == 21
    assert {k: records[0][k] for k in fields} == fields and records[0]["name"] == "parrot.access"
