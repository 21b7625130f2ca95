"""Limits over real HTTP: each one hit gives a clear 413 / 429 that names the limit and its
value, loses nothing, and leaves the server healthy and other sessions unaffected.

The ServeCore runs with small limits (the defaults are far above what these tests could
send quickly) on a SQLite file, with the fake engine (the limits are the ServeCore's; the
engine's own body limit is tested on the real engine's server)."""

from __future__ import annotations

import argparse
import socket

import httpx
import pytest
from conftest import ServerThread

from parrot.cli.settings import ServeSettings, add_serve_arguments
from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.limits.settings import Limits
from parrot.platform.store.store import Store, sqlite_url

LIMITS = Limits(
    max_body_bytes=64 * 1024,
    max_value_chars=1000,
    max_prompt_chars=2000,
    max_sessions_per_client=3,
    max_vars_per_session=6,
    max_calls_per_session=3,
    max_pending_calls=4,
)


@pytest.fixture
def api(fake_engine, tmp_path):
    core = ServeCore(store=Store(sqlite_url(tmp_path)), limits=LIMITS)
    app = create_app(core, engine_urls=(fake_engine.url,))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def new_session(api) -> tuple[str, dict]:
    r = api.post("/v1/session")
    assert r.status_code == 201, r.text
    return r.json()["session_id"], {"Authorization": f"Bearer {r.json()['session_auth']}"}


def refused(r: httpx.Response, status: int, limit: str, value: int) -> None:
    """A refusal as a client should see it: the status, a JSON error naming the limit."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["code"] == {413: "payload_too_large", 429: "too_many_requests"}[status]
    assert limit in error["message"] and str(value) in error["message"], error["message"]


def healthy(api) -> None:
    assert api.get("/healthz").json()["status"] == "ok"


def out(name: str) -> dict:
    return {"name": name, "is_output": True, "sampling": {"max_tokens": 2, "temperature": 0}}


def call(api, sid: str, auth: dict, template: str, params: list[dict]) -> httpx.Response:
    return api.post(
        "/v1/semantic_call",
        headers=auth,
        json={"session_id": sid, "template": template, "parameters": params},
    )


def var(api, sid: str, auth: dict, name: str, value: str | None = None) -> httpx.Response:
    body = {"session_id": sid, "name": name} | ({} if value is None else {"value": value})
    return api.post("/v1/semantic_var", headers=auth, json=body)


def get_value(api, sid: str, auth: dict, var_id: str) -> httpx.Response:
    return api.get(f"/v1/semantic_var/{var_id}", params={"session_id": sid, "timeout": 120}, headers=auth)


# -- 413 ------------------------------------------------------------------------------------
def test_a_body_over_the_limit_is_413_on_the_servecore(api):
    sid, auth = new_session(api)
    r = var(api, sid, auth, "big", "x" * (LIMITS.max_body_bytes + 1))
    refused(r, 413, "max_body_bytes", LIMITS.max_body_bytes)
    assert api.get(f"/v1/session/{sid}", headers=auth).json()["vars"] == []
    assert var(api, sid, auth, "small", "ok").status_code == 201
    healthy(api)


def raw_post(url: str, path: str, head: str) -> tuple[int, bytes]:
    """A POST whose headers say what ``head`` says (a lying Content-Length, no body): the
    status and the rest of the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}Connection: close\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer


@pytest.mark.parametrize("declared", ["999999999999", f"{LIMITS.max_body_bytes + 1}"])
def test_a_declared_body_over_the_limit_is_413_even_where_no_body_is_read(api, declared):
    """Issue 37 (9): ``POST /v1/session`` reads no body, so Litestar's limit (applied on
    reading) never applied: ``Content-Length: 999999999999`` got a 201 and a session."""
    status, answer = raw_post(str(api.base_url), "/v1/session", f"Content-Length: {declared}\r\n")
    assert status == 413 and b"max_body_bytes" in answer, answer[:300]
    status, answer = raw_post(str(api.base_url), "/v1/session", "Content-Length: lots\r\n")
    assert status == 400, answer[:300]
    assert api.post("/v1/session").status_code == 201
    healthy(api)


def test_a_body_over_the_limit_is_413_on_the_engine(engine):
    from parrot.engines.builtin.server.app import create_app as engine_app

    with ServerThread(engine_app(engine, manage_engine=False, max_body_bytes=4096)) as server:
        r = httpx.post(f"{server.url}/tokenize", json={"text": "word " * 2000})
        refused(r, 413, "max_body_bytes", 4096)
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "word " * 2000, "max_tokens": 1})
        refused(r, 413, "max_body_bytes", 4096)
        assert httpx.post(f"{server.url}/tokenize", json={"text": "word"}).json()["token_ids"]
        assert httpx.get(f"{server.url}/ping").status_code == 200


def test_values_over_the_limit_are_413_and_leave_nothing_behind(api):
    sid, auth = new_session(api)
    big = "v" * (LIMITS.max_value_chars + 1)
    refused(var(api, sid, auth, "a", big), 413, "max_value_chars", LIMITS.max_value_chars)
    empty = var(api, sid, auth, "b").json()["var_id"]
    r = api.put(f"/v1/semantic_var/{empty}", headers=auth, json={"session_id": sid, "value": big})
    refused(r, 413, "max_value_chars", LIMITS.max_value_chars)
    r = call(api, sid, auth, "Say {{x}}: {{y}}", [{"name": "x", "value": big}, out("y")])
    refused(r, 413, "max_value_chars", LIMITS.max_value_chars)
    body = {"session_id": sid, "inputs": [{"value": big}], "steps": [{"type": "upper"}], "output": "u"}
    r = api.post("/v1/semantic_transform", headers=auth, json=body)
    refused(r, 413, "max_value_chars", LIMITS.max_value_chars)
    info = api.get(f"/v1/session/{sid}", headers=auth).json()
    assert info["calls"] == [] and [v["var_id"] for v in info["vars"]] == [empty]
    # The variable refused a big value still takes a good one, and a value at the limit passes.
    r = api.put(f"/v1/semantic_var/{empty}", headers=auth, json={"session_id": sid, "value": "tides"})
    assert r.status_code == 200, r.text
    assert get_value(api, sid, auth, empty).json()["value"] == "tides"
    assert var(api, sid, auth, "c", "v" * LIMITS.max_value_chars).status_code == 201
    healthy(api)


def test_prompts_over_the_limit_are_413_on_calls_and_the_openai_front(api):
    sid, auth = new_session(api)
    long = "p" * LIMITS.max_prompt_chars + " {{y}}"
    refused(call(api, sid, auth, long, [out("y")]), 413, "max_prompt_chars", LIMITS.max_prompt_chars)
    info = api.get(f"/v1/session/{sid}", headers=auth).json()
    assert info["vars"] == [] and info["calls"] == []
    r = api.post("/v1/completions", json={"prompt": "p" * (LIMITS.max_prompt_chars + 1), "max_tokens": 1})
    refused(r, 413, "max_prompt_chars", LIMITS.max_prompt_chars)
    chat = {"messages": [{"role": "user", "content": "p" * LIMITS.max_prompt_chars}], "max_tokens": 1}
    refused(api.post("/v1/chat/completions", json=chat), 413, "max_prompt_chars", LIMITS.max_prompt_chars)
    assert api.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 1}).status_code == 200
    healthy(api)


# -- 429 ------------------------------------------------------------------------------------
def test_sessions_per_client_are_429_until_one_is_deleted(api):
    sessions = [new_session(api) for _ in range(LIMITS.max_sessions_per_client)]
    refused(api.post("/v1/session"), 429, "max_sessions_per_client", LIMITS.max_sessions_per_client)
    # The sessions it has are unaffected, and deleting one makes room.
    sid, auth = sessions[0]
    assert var(api, sid, auth, "a", "1").status_code == 201
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code == 204
    new_session(api)
    refused(api.post("/v1/session"), 429, "max_sessions_per_client", LIMITS.max_sessions_per_client)
    healthy(api)


def test_variables_and_calls_per_session_are_429(api):
    sid, auth = new_session(api)
    made = [
        var(api, sid, auth, f"v{n}", "x").json()["var_id"] for n in range(LIMITS.max_vars_per_session - 2)
    ]
    # A call with two new variables (an inline input, an output) fits exactly; then none does.
    first = call(api, sid, auth, "Echo {{a}}: {{b}}", [{"name": "a", "value": "hi"}, out("b")])
    assert first.status_code == 201, first.text
    refused(var(api, sid, auth, "more", "x"), 429, "max_vars_per_session", LIMITS.max_vars_per_session)
    r = call(api, sid, auth, "Echo {{a}}: {{b}}", [{"name": "a", "var_id": made[0]}, out("b")])
    refused(r, 429, "max_vars_per_session", LIMITS.max_vars_per_session)

    other, other_auth = new_session(api)  # another session is unaffected
    calls = [
        call(api, other, other_auth, "Say hi: {{b}}", [out("b")]) for _ in range(LIMITS.max_calls_per_session)
    ]
    assert all(c.status_code == 201 for c in calls), [c.text for c in calls]
    r = call(api, other, other_auth, "Say hi: {{b}}", [out("b")])
    refused(r, 429, "max_calls_per_session", LIMITS.max_calls_per_session)
    # Nothing accepted was lost: every accepted call finishes.
    for c in calls:
        assert get_value(api, other, other_auth, c.json()["outputs"]["b"]).json()["ready"]
    assert get_value(api, sid, auth, first.json()["outputs"]["b"]).json()["ready"]
    assert len(api.get(f"/v1/session/{other}", headers=other_auth).json()["calls"]) == 3
    healthy(api)


def test_pending_calls_server_wide_are_429_until_some_finish(api):
    """Calls waiting for an input nobody set yet stay pending: the server takes
    ``max_pending_calls`` of them, then refuses more (the OpenAI front too) until they run."""
    waiting = []
    for _ in range(2):
        sid, auth = new_session(api)
        gate = var(api, sid, auth, "gate").json()["var_id"]
        for _ in range(2):
            r = call(api, sid, auth, "After {{g}}: {{o}}", [{"name": "g", "var_id": gate}, out("o")])
            assert r.status_code == 201, r.text
            waiting.append((sid, auth, gate, r.json()["outputs"]["o"]))
    sid, auth = new_session(api)
    r = call(api, sid, auth, "Now: {{o}}", [out("o")])
    refused(r, 429, "max_pending_calls", LIMITS.max_pending_calls)
    r = api.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 1})
    refused(r, 429, "max_pending_calls", LIMITS.max_pending_calls)
    assert api.get(f"/v1/session/{sid}", headers=auth).json()["calls"] == []
    healthy(api)
    # Opening the gates runs every waiting call (none was lost), and frees room for more.
    for s, a, gate, _ in waiting[::2]:
        assert (
            api.put(f"/v1/semantic_var/{gate}", headers=a, json={"session_id": s, "value": "go"}).status_code
            == 200
        )
    for s, a, _, output in waiting:
        assert get_value(api, s, a, output).json()["ready"]
    r = call(api, sid, auth, "Now: {{o}}", [out("o")])
    assert r.status_code == 201, r.text
    assert api.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 1}).status_code == 200


# -- settings -------------------------------------------------------------------------------
def test_limits_come_from_flags_and_variables_with_documented_defaults():
    def settings(argv: list[str], env: dict[str, str]) -> ServeSettings:
        parser = argparse.ArgumentParser()
        add_serve_arguments(parser, env)
        return ServeSettings.from_args(parser.parse_args(argv))

    assert settings([], {}).limits == Limits()
    assert Limits().max_body_bytes == 32 * 2**20 and Limits().max_pending_calls == 10_000
    s = settings(
        ["--max-pending-calls", "7"], {"PARROT_MAX_PENDING_CALLS": "5", "PARROT_MAX_VALUE_CHARS": "99"}
    )
    assert (s.limits.max_pending_calls, s.limits.max_value_chars) == (7, 99)
    with pytest.raises(ValueError, match="max_vars_per_session"):
        settings(["--max-vars-per-session", "0"], {})
    with pytest.raises(ValueError, match="PARROT_MAX_CALLS_PER_SESSION"):
        settings([], {"PARROT_MAX_CALLS_PER_SESSION": "many"})


def test_a_transform_cannot_build_a_value_over_the_value_limit(api):
    """Each input is within the value limit; their join is not. The call fails with the
    reason (the result is never built), and the session goes on."""
    sid, auth = new_session(api)
    big = var(api, sid, auth, "big", "x" * 900).json()["var_id"]
    r = api.post(
        "/v1/semantic_transform",
        headers=auth,
        json={
            "session_id": sid,
            "inputs": [{"var_id": big}] * 4,
            "steps": [{"type": "join", "separator": " "}],
            "output": "joined",
        },
    )
    assert r.status_code == 201, r.text
    got = api.get(
        f"/v1/semantic_var/{r.json()['outputs']['joined']}", params={"session_id": sid}, headers=auth
    )
    assert got.status_code == 424, got.text
    assert "would make a value of 3603 characters, over the limit of 1000" in got.json()["error"]["message"]
    healthy(api)
