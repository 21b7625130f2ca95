"""Acceptance 4: kill the ServeCore process (SIGKILL) mid-workload, start it again on the
same database: sessions, variables and finished values are intact, unfinished calls run (on
SQLite with the real engine, on PostgreSQL with the fake one, whose tokens take 20 ms)."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from conftest import ParrotProcess, database_url, free_port

CHAIN = (
    ("One sentence about {{topic}}: {{a}}", "topic", "a"),
    ("Make it shorter: {{a}}\nShorter: {{b}}", "a", "b"),
    ("A title for: {{b}}\nTitle: {{c}}", "b", "c"),
)


def start_servecore(port: int, engine_url: str, db: str) -> ParrotProcess:
    env = {**os.environ, "PARROT_ADMIN_TOKEN": "admin-secret"}
    process = ParrotProcess(["serve", "--port", str(port), "--engine", engine_url, "--db", db], env)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, "serve")
    return process


def submit_chain(api: httpx.Client, sid: str, auth: dict, topic: str, max_tokens: int) -> list[dict]:
    var = api.post(
        "/v1/semantic_var", json={"session_id": sid, "name": "topic", "value": topic}, headers=auth
    )
    ids = {"topic": var.json()["var_id"]}
    calls = []
    for template, src, dst in CHAIN:
        out = {"name": dst, "is_output": True, "sampling": {"max_tokens": max_tokens, "temperature": 0}}
        body = {
            "session_id": sid,
            "template": template,
            "parameters": [{"name": src, "var_id": ids[src]}, out],
        }
        call = api.post("/v1/semantic_call", json=body, headers=auth)
        assert call.status_code == 201, call.text
        ids[dst] = call.json()["outputs"][dst]
        calls.append(call.json())
    body = {
        "session_id": sid,
        "inputs": [{"var_id": ids["c"]}],
        "steps": [{"type": "upper"}],
        "output": "loud",
    }
    transform = api.post("/v1/semantic_transform", json=body, headers=auth)
    assert transform.status_code == 201, transform.text
    calls.append(transform.json())
    return calls


@pytest.mark.spawns
@pytest.mark.parametrize(
    "database, engine_url",
    [
        pytest.param("sqlite", "real", id="sqlite-real"),
        pytest.param("postgresql", "fake", id="postgresql-fake", marks=pytest.mark.postgresql),
    ],
    indirect=["engine_url"],
)
def test_killed_servecore_restarts_with_its_sessions_and_finishes_the_calls(
    engine_url, tmp_path, request, database
):
    """On SQLite and on PostgreSQL (``parrot serve --db postgresql+asyncpg://...``)."""
    if "fake_engine" in request.fixturenames:
        request.getfixturevalue("fake_engine").engine.step_s = 0.02  # running when killed
    port = free_port()
    db = database_url(request, database, tmp_path)
    first = start_servecore(port, engine_url, db)
    sessions = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as api:
            # One call finished before the kill: its value must come back unchanged.
            s = api.post("/v1/session").json()
            sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
            early = submit_chain(api, sid, auth, "lighthouses", 4)
            last = early[-1]["outputs"]["loud"]
            finished = api.get(f"/v1/semantic_var/{last}", params={"session_id": sid}, headers=auth).json()
            assert finished["ready"]
            sessions.append((sid, auth, early))
            # Then a workload that is still running when the process dies.
            for topic in ("tides", "glaciers", "volcanoes", "deserts"):
                s = api.post("/v1/session").json()
                sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
                sessions.append((sid, auth, submit_chain(api, sid, auth, topic, 24)))
            deadline = time.monotonic() + 60
            while True:  # kill once some of the workload has run, but not all of it
                states = [
                    api.get(f"/v1/session/{sid}", headers=auth).json()["calls"] for sid, auth, _ in sessions
                ]
                flat = [c["state"] for calls in states[1:] for c in calls]
                if "done" in flat or "running" in flat or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
    finally:
        first.kill()
    assert flat.count("done") < len(flat), "the workload finished before the kill; nothing to recover"

    second = start_servecore(port, engine_url, db)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as api:
            engines = api.get("/v1/engines").json()
            assert [e["url"] for e in engines] == [engine_url]  # the stored record, reused
            for sid, auth, calls in sessions:
                info = api.get(f"/v1/session/{sid}", headers=auth)
                assert info.status_code == 200, info.text
                assert [c["call_id"] for c in info.json()["calls"]] == [c["call_id"] for c in calls]
                assert len(info.json()["vars"]) == 5  # topic, a, b, c, loud
                values = {}
                for name, var_id in (("c", calls[2]["outputs"]["c"]), ("loud", calls[3]["outputs"]["loud"])):
                    r = api.get(f"/v1/semantic_var/{var_id}", params={"session_id": sid}, headers=auth)
                    assert r.status_code == 200, (name, r.text)
                    values[name] = r.json()
                assert values["c"]["ready"] and values["c"]["value"], values
                assert values["loud"]["value"] == values["c"]["value"].upper()
                for call in calls:
                    state = api.get(
                        f"/v1/semantic_call/{call['call_id']}", params={"session_id": sid}, headers=auth
                    ).json()
                    assert state["state"] == "done", state
                    assert state["engine"] in (engines[0]["engine_id"], "servecore"), state
                    assert state["timings"]["finished_at"] >= state["timings"]["submitted_at"]
            sid, auth, early = sessions[0]
            again = api.get(
                f"/v1/semantic_var/{early[-1]['outputs']['loud']}", params={"session_id": sid}, headers=auth
            ).json()
            assert again["value"] == finished["value"]
            # The old session_auth still guards the session after the restart.
            wrong = api.get(f"/v1/session/{sid}", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 403
    finally:
        second.stop()


async def test_a_stored_engine_that_does_not_answer_comes_back_marked_down(tmp_path, fake_engine):
    """A restart finds its engines in the store; one that is gone is kept, marked down, with
    its model (so calls for it get a clear 503, and it is used again once it answers)."""
    from parrot.engines.protocol.errors import EngineUnavailableError
    from parrot.platform.serve.calls.service import Binding
    from parrot.platform.serve.core import ServeCore
    from parrot.platform.store.store import Store, sqlite_url

    store = Store(sqlite_url(tmp_path))
    await store.migrate()
    await store.write(
        lambda db: db.save_engine(
            "engine-7", "builtin", f"http://127.0.0.1:{free_port()}", "gone-model", {"capacity": 2}
        )
    )
    await store.close()
    core = ServeCore(store=Store(sqlite_url(tmp_path)))
    await core.start(engine_urls=(fake_engine.url,))
    try:
        slots = core.scheduler.engines
        assert not slots["engine-7"].up and slots["engine-7"].model == "gone-model"
        assert slots["engine-7"].task_limit == 2
        live = next(s for s in slots.values() if s.engine_id != "engine-7")
        assert live.up and live.engine_id == "engine-8"  # numbering goes on after the stored ids
        session, _ = await core.sessions.create()
        with pytest.raises(EngineUnavailableError, match="down"):
            await core.calls.submit(
                session, "Q: {{a}}", [Binding(name="a", is_output=True)], ["gone-model"], None
            )
    finally:
        await core.stop()


def test_healthz_is_degraded_with_its_reason_while_no_engine_is_up(tmp_path, fake_engine):
    import asyncio

    from conftest import ServerThread

    from parrot.platform.api.app import create_app
    from parrot.platform.serve.core import ServeCore
    from parrot.platform.store.store import Store, sqlite_url

    (tmp_path / "none").mkdir()
    (tmp_path / "gone").mkdir()
    with ServerThread(create_app(ServeCore(store=Store(sqlite_url(tmp_path / "none"))))) as server:
        health = httpx.get(f"{server.url}/healthz").json()
        assert health["status"] == "degraded" and health["reason"] == "no engine is registered"
        assert (health["engines"], health["engines_up"]) == (0, 0)

    async def store_a_gone_engine() -> None:
        store = Store(sqlite_url(tmp_path / "gone"))
        await store.migrate()
        gone = f"http://127.0.0.1:{free_port()}"
        await store.write(lambda db: db.save_engine("engine-1", "builtin", gone, "m", {"capacity": 2}))
        await store.close()

    asyncio.run(store_a_gone_engine())
    with ServerThread(create_app(ServeCore(store=Store(sqlite_url(tmp_path / "gone"))))) as server:
        health = httpx.get(f"{server.url}/healthz").json()
        assert (health["status"], health["engines"], health["reason"]) == ("degraded", 1, "no engine is up")
    app = create_app(ServeCore(store=Store(sqlite_url(tmp_path / "gone"))), engine_urls=(fake_engine.url,))
    with ServerThread(app) as server:
        health = httpx.get(f"{server.url}/healthz").json()
        assert health == {"status": "ok", "engines": 2, "engines_up": 1, "reason": None, "stage": None}
