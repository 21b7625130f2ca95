"""Issue 14.4: every failure of a call ends in ``failed`` with its reason, its consumers in
``producer_failed``, and every text the ServeCore keeps is valid UTF-8, before and after a
restart. Over real HTTP against a real ``parrot serve`` on a real SQLite file."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from conftest import ParrotProcess, ServerThread, free_port

from parrot.platform.api.app import create_app
from parrot.platform.serve.calls import transforms
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url

# value given to json_field -> what the reason of the failed call says
POISON = {
    "deep": ("[" * 100_000 + "]" * 100_000, "recursion"),  # RecursionError
    "long_int": ("1" * 5000, "digits"),  # ValueError: int string too long
    "surrogate": ('{"a": "\\ud800"}', "not valid text: lone surrogate U+D800"),  # a poisoned value
}


def start(port: int, db: str) -> ParrotProcess:
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "admin"}
    process = ParrotProcess(["serve", "--port", str(port), "--no-engine", "--db", db, "--no-dashboard"], env)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, "serve")
    return process


def settled(api: httpx.Client, sid: str, auth: dict, call_id: str, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        info = api.get(f"/v1/semantic_call/{call_id}", params={"session_id": sid}, headers=auth).json()
        if info["state"] in ("done", "failed") or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


def check_failed(api: httpx.Client, sid: str, auth: dict, calls: dict) -> None:
    """Each poisoned transform failed with its reason, its consumer with the producer's."""
    for name, (producer, consumer) in calls.items():
        reason = POISON[name][1]
        first = settled(api, sid, auth, producer["call_id"])
        assert first["state"] == "failed" and reason in first["error"], (name, first)
        second = settled(api, sid, auth, consumer["call_id"])
        assert second["state"] == "failed" and "failed" in second["error"], (name, second)
        for call in (producer, consumer):
            (var_id,) = call["outputs"].values()
            params = {"session_id": sid, "timeout": 5}
            var = api.get(f"/v1/semantic_var/{var_id}", params=params, headers=auth)
            assert var.status_code == 424, (name, var.status_code, var.text)
            error = var.json()["error"]
            assert error["code"] == "producer_failed" and reason in error["message"], (name, error)
    info = api.get(f"/v1/session/{sid}", headers=auth)
    assert info.status_code == 200, info.text
    assert all(v["error"] for v in info.json()["vars"] if not v["ready"]), info.text


@pytest.mark.spawns
def test_transforms_python_cannot_finish_fail_their_calls_and_consumers_across_a_restart(tmp_path):
    """Before: RecursionError and ValueError escaped the transform (the call stayed
    ``running``, its consumer ``pending``, forever); a lone surrogate made the variable's
    GET a 500, its store write failed, and the call could not be restored."""
    port, db = free_port(), f"sqlite+aiosqlite:///{tmp_path / 'parrot.db'}"
    first = start(port, db)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as api:
            s = api.post("/v1/session").json()
            sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
            calls = {}
            for name, (value, _) in POISON.items():
                body = {
                    "session_id": sid,
                    "inputs": [{"value": value}],
                    "steps": [{"type": "json_field", "path": "a"}],
                    "output": f"{name}_field",
                }
                producer = api.post("/v1/semantic_transform", json=body, headers=auth)
                assert producer.status_code == 201, producer.text
                consumer = api.post(
                    "/v1/semantic_transform",
                    json={
                        "session_id": sid,
                        "inputs": [{"var_id": producer.json()["outputs"][f"{name}_field"]}],
                        "steps": [{"type": "upper"}],
                        "output": f"{name}_loud",
                    },
                    headers=auth,
                )
                assert consumer.status_code == 201, consumer.text
                calls[name] = (producer.json(), consumer.json())
            check_failed(api, sid, auth, calls)
            assert api.get("/healthz").status_code == 200
    finally:
        first.kill()  # SIGKILL: what was acknowledged must be in the store
    second = start(port, db)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as api:
            check_failed(api, sid, auth, calls)
    finally:
        second.kill()


@pytest.mark.spawns
def test_a_value_with_a_lone_surrogate_is_refused_with_a_400_that_says_so(tmp_path):
    port, db = free_port(), f"sqlite+aiosqlite:///{tmp_path / 'parrot.db'}"
    process = start(port, db)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as api:
            s = api.post("/v1/session").json()
            sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
            headers = {**auth, "Content-Type": "application/json"}
            var = api.post("/v1/semantic_var", json={"session_id": sid, "name": "x"}, headers=auth).json()
            raw = '{"session_id": "SID", "value": "ok \\ud800 then"}'.replace("SID", sid)  # a lone escape
            for method, path in (("PUT", f"/v1/semantic_var/{var['var_id']}"), ("POST", "/v1/semantic_var")):
                body = raw if method == "PUT" else raw.replace('"value"', '"name": "y", "value"')
                r = api.request(method, path, content=body, headers=headers)
                assert r.status_code == 400, r.text
                assert "surrogate" in r.json()["error"]["message"], r.text
            # Nothing was stored; the variable can still be set, and the server is healthy.
            fine = {"session_id": sid, "value": "fine"}
            ok = api.put(f"/v1/semantic_var/{var['var_id']}", json=fine, headers=auth)
            assert ok.status_code == 200, ok.text
            assert api.get("/healthz").status_code == 200
    finally:
        process.kill()


@pytest.fixture
def core_api(tmp_path):
    core = ServeCore(store=Store(sqlite_url(tmp_path)))
    with (
        ServerThread(create_app(core, admin_token="admin")) as server,
        httpx.Client(base_url=server.url, timeout=60) as api,
    ):
        yield api


def test_an_unexpected_error_in_a_transform_fails_the_call_with_the_reason(core_api, monkeypatch):
    """Fault injection: any exception while a call runs (not only the expected ones) ends
    the call ``failed`` with the reason, never a watcher task dying unseen."""

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(transforms, "apply", broken)
    s = core_api.post("/v1/session").json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
    body = {"session_id": sid, "inputs": [{"value": "x"}], "steps": [{"type": "upper"}], "output": "y"}
    call = core_api.post("/v1/semantic_transform", json=body, headers=auth).json()
    info = settled(core_api, sid, auth, call["call_id"], timeout_s=10)
    assert info["state"] == "failed", info
    assert "internal error: RuntimeError('injected fault')" in info["error"], info


class SurrogateEndpoint(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint whose completion text holds a lone surrogate escape
    (valid JSON that the ``json`` module decodes to a string with no UTF-8 form), streamed
    as the ServeCore asks (``streams = False``: answered as one JSON body, whatever it asks)."""

    streams = True

    def do_GET(self) -> None:  # GET /v1/models
        self._send(b'{"object": "list", "data": [{"id": "odd-model", "object": "model", "created": 0}]}')

    def do_POST(self) -> None:  # POST /v1/completions
        self.rfile.read(int(self.headers["Content-Length"]))
        body = (
            b'{"id": "c1", "object": "text_completion", "created": 0, "model": "odd-model", '
            b'"choices": [{"index": 0, "text": "ok \\ud800 then", "finish_reason": "stop"}]}'
        )
        if self.streams:
            self._send(b"data: " + body + b"\n\ndata: [DONE]\n\n", "text/event-stream")
        else:
            self._send(body)

    def _send(self, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class JsonOnlyEndpoint(SurrogateEndpoint):
    streams = False


@contextlib.contextmanager
def call_on_endpoint(core_api, handler) -> Iterator[tuple[str, dict, dict]]:
    """``handler`` served on 127.0.0.1 and registered as an OpenAI engine; a call of one
    output submitted to it: (session id, auth headers, the call)."""
    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    try:
        body = {
            "kind": "openai",
            "base_url": f"http://127.0.0.1:{endpoint.server_port}/v1",
            "model": "odd-model",
            "api_key": "sk-test",
            "api": "completions",
        }
        r = core_api.post("/v1/engines", json=body, headers={"Authorization": "Bearer admin"})
        assert r.status_code == 201, r.text
        s = core_api.post("/v1/session").json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        body = {"session_id": sid, "template": "Say: {{a}}", "parameters": [{"name": "a", "is_output": True}]}
        yield sid, auth, core_api.post("/v1/semantic_call", json=body, headers=auth).json()
    finally:
        endpoint.shutdown()


def test_text_with_a_lone_surrogate_from_an_openai_endpoint_is_stored_as_valid_text(core_api):
    """Before: the variable took the lone surrogate; its GET answered 500 and its store
    write failed. Now the OpenAI engine replaces it with U+FFFD (as the builtin engine does
    with bytes that are not UTF-8), so the value, the stream and the store agree."""
    with call_on_endpoint(core_api, SurrogateEndpoint) as (sid, auth, call):
        params = {"session_id": sid}
        var = core_api.get(f"/v1/semantic_var/{call['outputs']['a']}", params=params, headers=auth)
        assert var.status_code == 200 and var.json()["value"] == "ok \ufffd then", var.text
        info = settled(core_api, sid, auth, call["call_id"])
        assert info["state"] == "done", info


def test_an_openai_endpoint_that_does_not_stream_fails_the_call_with_the_reason(core_api):
    """The ServeCore streams every generation; an endpoint that answers one JSON body
    instead was read as an empty stream, and the call ended ``done`` with an empty value."""
    with call_on_endpoint(core_api, JsonOnlyEndpoint) as (sid, auth, call):
        info = settled(core_api, sid, auth, call["call_id"])
        assert info["state"] == "failed" and "stream: true" in info["error"], info


def test_a_task_the_dispatcher_trips_on_fails_and_the_others_still_run(fake_engine, tmp_path, monkeypatch):
    """Fault injection: an exception while placing one task ended the dispatch loop (a task
    nobody awaited), so that call and every later one stayed queued forever."""
    from parrot.platform.serve.scheduler.policy import SchedulingPolicy

    placement = SchedulingPolicy.placement
    tripped = []

    def trip_once(self, task, *args):
        if not tripped:
            tripped.append(task.chain.call.call_id)
            raise RuntimeError("injected fault")
        return placement(self, task, *args)

    monkeypatch.setattr(SchedulingPolicy, "placement", trip_once)
    core = ServeCore(store=Store(sqlite_url(tmp_path)))
    app = create_app(core, engine_urls=(fake_engine.url,))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as api:
        s = api.post("/v1/session").json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        calls = []
        for n in range(2):
            out = {"name": "a", "is_output": True, "sampling": {"max_tokens": 2, "temperature": 0}}
            body = {"session_id": sid, "template": f"Count {n}: {{{{a}}}}", "parameters": [out]}
            call = api.post("/v1/semantic_call", json=body, headers=auth)
            assert call.status_code == 201, call.text
            calls.append(call.json())
            info = settled(api, sid, auth, call.json()["call_id"])
            if n == 0:
                assert info["state"] == "failed", info
                assert "internal error: RuntimeError('injected fault')" in info["error"], info
            else:
                assert info["state"] == "done", info
        assert tripped == [calls[0]["call_id"]]
