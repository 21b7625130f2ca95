"""The fault suite (issue 14), quick size: what the other fault tests do not cover already.

- engine SIGKILL / SIGSTOP mid-workload: ``test_failover.py``;
- ServeCore SIGKILL + restart on SQLite and PostgreSQL: ``test_restart.py`` (and the
  contexts the killed run left: ``test_orphans.py``);
- a database that refuses a write, in the ServeCore: ``test_journal.py``;
- here: a read-only or full database under the real API (clear 503s, reads go on, no
  corruption, back to normal once writable), and clients that go away during a ``get``, a
  stream and a long call (nothing lost, nothing leaked: the engine holds only what the
  ServeCore still tracks, nothing of a deleted session, and runs no job).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time

import httpx
import pytest
from conftest import ServerThread
from httpx_sse import connect_sse
from sqlalchemy import event

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store

ADMIN = "admin-token"


class DatabaseFault:
    """Makes the real SQLite database refuse writes, as a read-only file or a full disk does,
    by SQLite's own switches (``query_only``, ``max_page_count``), set on every connection
    the store checks out (so it works whichever thread the server runs on)."""

    def __init__(self, store: Store, kind: str) -> None:
        self.store, self.kind, self.on = store, kind, False
        event.listen(store.engine.sync_engine, "checkout", self._apply)

    def _apply(self, dbapi_connection, _record, _proxy) -> None:
        cursor = dbapi_connection.cursor()
        if self.kind == "read-only":
            cursor.execute(f"PRAGMA query_only = {int(self.on)}")
        else:  # full: no page beyond those the file has now (SQLite's own default otherwise)
            cursor.execute("PRAGMA page_count")
            pages = cursor.fetchone()[0]
            cursor.execute(f"PRAGMA max_page_count = {pages if self.on else 1073741823}")
        cursor.close()


@pytest.fixture
def served(fake_engine, tmp_path):
    """A ServeCore on a SQLite file and the fake engine, whose tokens take 20 ms (a call of
    48 tokens outlasts a client that gives up after 0.3 s)."""
    fake_engine.engine.step_s = 0.02
    store = Store(f"sqlite+aiosqlite:///{tmp_path / 'parrot.db'}")
    core = ServeCore(store=store)
    app = create_app(core, engine_urls=(fake_engine.url,), admin_token=ADMIN)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=120) as api:
        yield core, store, api, tmp_path / "parrot.db"


def new_session(api: httpx.Client) -> tuple[str, dict]:
    body = api.post("/v1/session").json()
    return body["session_id"], {"Authorization": f"Bearer {body['session_auth']}"}


def submit(api, sid, auth, topic: str, max_tokens: int, ignore_eos: bool = False) -> str:
    """A call whose prompt starts with session data (no shared prefix context); its output id.

    ``ignore_eos`` makes it generate all ``max_tokens``: a call that must still run when a
    client gives up cannot be allowed to end at an early end-of-sequence token."""
    var = api.post("/v1/semantic_var", json={"session_id": sid, "name": "t", "value": topic}, headers=auth)
    assert var.status_code == 201, var.text
    sampling = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos}
    out = {"name": "a", "is_output": True, "sampling": sampling}
    body = {
        "session_id": sid,
        "template": "{{t}}, in one line: {{a}}",
        "parameters": [{"name": "t", "var_id": var.json()["var_id"]}, out],
    }
    call = api.post("/v1/semantic_call", json=body, headers=auth)
    assert call.status_code == 201, call.text
    return call.json()["outputs"]["a"]


def get_value(api, sid, auth, var_id: str, timeout: float = 120) -> dict:
    r = api.get(f"/v1/semantic_var/{var_id}", params={"session_id": sid, "timeout": timeout}, headers=auth)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_a_database_that_refuses_writes_gets_clear_503s_and_recovers_intact(served, kind):
    _core, store, api, path = served
    sid, auth = new_session(api)
    first = get_value(api, sid, auth, submit(api, sid, auth, "Tides", 4))
    assert first["ready"]
    fault = DatabaseFault(store, kind)
    fault.on = True
    big = "x" * 256 * 1024  # needs new pages: refused by a full disk too
    refused = [
        api.post("/v1/semantic_var", json={"session_id": sid, "name": "big", "value": big}, headers=auth)
    ]
    if kind == "read-only":
        refused.append(api.post("/v1/session"))
    for r in refused:
        assert r.status_code == 503, r.text
        assert r.json()["error"]["message"].startswith("the database did not take the write"), r.text
    # Reads go on, the server stays healthy.
    assert get_value(api, sid, auth, first["var_id"])["value"] == first["value"]
    assert api.get(f"/v1/session/{sid}", headers=auth).status_code == 200
    assert api.get("/healthz").status_code == 200
    fault.on = False
    # Writable again: the same requests work, and the data is whole.
    again = api.post("/v1/semantic_var", json={"session_id": sid, "name": "big", "value": big}, headers=auth)
    assert again.status_code == 201, again.text
    second = get_value(api, sid, auth, submit(api, sid, auth, "Glaciers", 4))
    assert second["ready"]
    wanted = {first["var_id"]: first["value"], second["var_id"]: second["value"]}
    deadline = time.monotonic() + 10  # values are written off the request path
    while True:
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            query = "select var_id, value from semantic_vars where session_id = ?"
            values = dict(db.execute(query, (sid,)))
        if all(values.get(k) == v for k, v in wanted.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert values[first["var_id"]] == first["value"] and values[second["var_id"]] == second["value"]
    assert values[again.json()["var_id"]] == big
    assert sum(v == big for v in values.values()) == 1  # the refused write left nothing


def engine_contexts(engine_url: str) -> dict:
    return httpx.get(f"{engine_url}/ping", timeout=5).json()


def engine_idle_but_for_the_servecore(
    core: ServeCore, engine_url: str, others: int, timeout_s: float = 60
) -> None:
    """Waits until the engine runs no job and holds the contexts the ServeCore still tracks
    and the ``others`` it held before (of other tests' servers on the shared engine)."""
    slot = core.engines.slots()[0]
    deadline = time.monotonic() + timeout_s
    while True:
        info = engine_contexts(engine_url)
        idle = info["num_running"] == 0 and info["num_waiting"] == 0
        if idle and info["num_contexts"] == others + len(core.contexts.tree(slot)):
            return
        assert time.monotonic() < deadline, (
            f"engine not idle: {info}; the ServeCore tracks {len(core.contexts.tree(slot))}, "
            f"others held {others}"
        )
        time.sleep(0.2)


def test_clients_that_go_away_lose_nothing_and_leak_nothing(served, fake_engine):
    core, _store, api, _ = served
    held = len(core.contexts.tree(core.engines.slots()[0]))
    others = engine_contexts(fake_engine.url)["num_contexts"] - held
    # 1. A client gives up on a get of a long call: the call goes on, its value is kept.
    sid, auth = new_session(api)
    long_out = submit(api, sid, auth, "The history of lighthouses", 96, ignore_eos=True)
    with pytest.raises(httpx.ReadTimeout):
        api.get(
            f"/v1/semantic_var/{long_out}",
            params={"session_id": sid, "timeout": 120},
            headers=auth,
            timeout=httpx.Timeout(120, read=0.3),
        )
    value = get_value(api, sid, auth, long_out)
    assert value["ready"] and value["value"]
    # 2. Many clients go away mid-get at once, from their own connections.
    outs = [submit(api, sid, auth, f"Fact number {i} about rivers", 48, ignore_eos=True) for i in range(6)]

    async def give_up_on_all() -> None:
        async with httpx.AsyncClient(base_url=str(api.base_url), timeout=0.3) as quick:
            gets = [
                quick.get(f"/v1/semantic_var/{o}", params={"session_id": sid, "timeout": 60}, headers=auth)
                for o in outs
            ]
            results = await asyncio.gather(*gets, return_exceptions=True)
            assert all(isinstance(r, httpx.TimeoutException) for r in results), results

    asyncio.run(give_up_on_all())
    assert all(get_value(api, sid, auth, o)["value"] for o in outs)
    # 3. A streaming completion closed after a few chunks (the OpenAI front).
    body = {"prompt": "Once upon a time", "max_tokens": 64, "stream": True, "temperature": 0}
    with connect_sse(api, "POST", "/v1/completions", json=body) as source:
        assert source.response.status_code == 200
        for chunks, _event in enumerate(source.iter_sse(), 1):
            if chunks >= 3:
                break
    # Nothing lost: the session's values are all there; the server is healthy.
    info = api.get(f"/v1/session/{sid}", headers=auth).json()
    assert all(c["state"] == "done" for c in info["calls"]), info["calls"]
    assert api.get("/healthz").json()["engines_up"] == 1
    # Nothing leaked: once the session is deleted the engine holds only what the ServeCore
    # tracks (shared prefixes it may evict), nothing of the session, and runs no job.
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code in (200, 204)
    engine_idle_but_for_the_servecore(core, fake_engine.url, others)
    slot = core.engines.slots()[0]
    assert not core.contexts.tree(slot).of_session(sid)
    assert all(c.owner is None and c.refs == 0 for c in core.contexts.tree(slot).contexts.values())


def test_a_delete_the_store_refuses_changes_nothing(served):
    """Issue 24, defect 3: the store refuses the delete (503) and the session goes on as
    before, in memory and in the database; once writable, the delete works whole."""
    _core, store, api, path = served
    sid, auth = new_session(api)
    first = get_value(api, sid, auth, submit(api, sid, auth, "Tides", 4))
    fault = DatabaseFault(store, "read-only")
    fault.on = True
    r = api.delete(f"/v1/session/{sid}", headers=auth)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["message"].startswith("the database did not take the write"), r.text
    assert api.get(f"/v1/session/{sid}", headers=auth).status_code == 200
    assert get_value(api, sid, auth, first["var_id"])["value"] == first["value"]
    fault.on = False
    second = get_value(api, sid, auth, submit(api, sid, auth, "Glaciers", 4))  # still runs calls
    assert second["ready"]
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code in (200, 204)
    assert api.get(f"/v1/session/{sid}", headers=auth).status_code == 404
    with sqlite3.connect(path) as db:
        assert db.execute("select count(*) from sessions where session_id = ?", (sid,)).fetchone() == (0,)
