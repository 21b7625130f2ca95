"""The memory of values is bounded (issue 24, defect 4): per client address (429) and for the
whole server (507), whether a value is set, given inline or generated; a refusal names the
limit and its flag, stores nothing and leaves the server healthy; a deleted session gives
its share back; a restart counts the restored values again.

Over real HTTP with the fake engine and a SQLite file, with small limits. A value counts the
memory of its text: ``sys.getsizeof``, 49 + 1 a character for ASCII text."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from conftest import ServerThread
from test_journal import Refusal

from parrot.cli.settings import ServeSettings, add_serve_arguments
from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import InsufficientStorageError, StoreError
from parrot.platform.serve.limits.settings import Limits
from parrot.platform.serve.limits.value_budget import BIG_RELEASE, ValueBudget
from parrot.platform.store.store import Store, sqlite_url

VALUE = "x" * 900
SIZE = sys.getsizeof(VALUE)  # 949 bytes
SHARE = 2 * SIZE + 500  # two values per client, not three


@contextmanager
def serve(fake_engine, tmp_path, limits: Limits) -> Iterator[httpx.Client]:
    core = ServeCore(store=Store(sqlite_url(tmp_path)), limits=limits)
    app = create_app(core, engine_urls=(fake_engine.url,))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


class Session:
    def __init__(self, api: httpx.Client) -> None:
        r = api.post("/v1/session")
        assert r.status_code == 201, r.text
        self.api, self.sid = api, r.json()["session_id"]
        self.auth = {"Authorization": f"Bearer {r.json()['session_auth']}"}

    def var(self, name: str, value: str | None = None) -> httpx.Response:
        body = {"session_id": self.sid, "name": name} | ({} if value is None else {"value": value})
        return self.api.post("/v1/semantic_var", headers=self.auth, json=body)

    def put(self, var_id: str, value: str) -> httpx.Response:
        body = {"session_id": self.sid, "value": value}
        return self.api.put(f"/v1/semantic_var/{var_id}", headers=self.auth, json=body)

    def get(self, var_id: str) -> httpx.Response:
        params = {"session_id": self.sid, "timeout": 120}
        return self.api.get(f"/v1/semantic_var/{var_id}", params=params, headers=self.auth)

    def call(self, template: str, params: list[dict]) -> httpx.Response:
        body = {"session_id": self.sid, "template": template, "parameters": params}
        return self.api.post("/v1/semantic_call", headers=self.auth, json=body)

    def info(self) -> dict:
        r = self.api.get(f"/v1/session/{self.sid}", headers=self.auth)
        assert r.status_code == 200, r.text
        return r.json()

    def delete(self) -> None:
        assert self.api.delete(f"/v1/session/{self.sid}", headers=self.auth).status_code == 204


def out(name: str) -> dict:
    return {"name": name, "is_output": True, "sampling": {"max_tokens": 4, "temperature": 0}}


def refused(r: httpx.Response, status: int, code: str, limit: str, value: int) -> None:
    assert r.status_code == status, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["code"] == code, error
    flag = "--" + limit.replace("_", "-")
    assert limit in error["message"] and str(value) in error["message"] and flag in error["message"], error


def healthy(api: httpx.Client) -> None:
    assert api.get("/healthz").json()["status"] == "ok"


def value_bytes(api) -> float:
    for line in api.get("/metrics").text.splitlines():
        if line.startswith("parrot:value_bytes "):
            return float(line.split()[-1])
    raise AssertionError("no parrot:value_bytes gauge")


def test_a_clients_share_of_value_memory_is_429_and_a_refusal_stores_nothing(fake_engine, tmp_path):
    limits = Limits(max_value_chars=1000, max_value_bytes_per_client=SHARE)
    with serve(fake_engine, tmp_path, limits) as api:
        first = Session(api)
        assert first.var("a", VALUE).status_code == 201
        empty = first.var("later").json()["var_id"]
        # The client's share counts all its sessions: a second session fills it.
        second = Session(api)
        assert second.var("b", VALUE).status_code == 201
        for r in (
            second.var("c", VALUE),  # a value given at creation
            first.put(empty, VALUE),  # a value set
            first.call("Say {{doc}} {{a}}", [{"name": "doc", "value": VALUE}, out("a")]),  # inline
            api.post(
                "/v1/semantic_transform",
                headers=first.auth,
                json={
                    "session_id": first.sid,
                    "inputs": [{"value": VALUE}],
                    "steps": [{"type": "upper"}],
                    "output": "loud",
                },
            ),
        ):
            refused(r, 429, "too_many_requests", "max_value_bytes_per_client", SHARE)
        healthy(api)
        # Nothing of the refused requests exists; the variable refused a value still waits.
        assert [v["name"] for v in second.info()["vars"]] == ["b"]
        listing = first.info()
        assert [(v["name"], v["ready"]) for v in listing["vars"]] == [("a", True), ("later", False)]
        assert listing["calls"] == []
        # Small values still fit; deleting a session gives its share back.
        assert first.put(empty, "small").status_code == 200
        held = value_bytes(api)
        assert held >= 2 * len(VALUE)  # /metrics shows what the values hold ("a", "b")
        second.delete()
        assert value_bytes(api) <= held - len(VALUE)
        third = Session(api)
        assert third.var("c", VALUE).status_code == 201
        assert first.get(empty).json()["value"] == "small"


def test_the_servers_bound_on_value_memory_is_507(fake_engine, tmp_path):
    bound = 2 * SIZE + 500
    limits = Limits(max_value_chars=1000, max_value_bytes=bound)
    with serve(fake_engine, tmp_path, limits) as api:
        s = Session(api)
        assert s.var("a", VALUE).status_code == 201 and s.var("b", VALUE).status_code == 201
        r = s.var("c", VALUE)
        refused(r, 507, "insufficient_storage", "max_value_bytes", bound)
        healthy(api)
        assert [v["name"] for v in s.info()["vars"]] == ["a", "b"]


def test_a_generated_value_over_budget_fails_its_call_naming_the_limit(fake_engine, tmp_path):
    doc = "x" * 1000
    share = sys.getsizeof(doc) + 40  # no room left for any generated value (49 bytes at least)
    limits = Limits(max_value_chars=1000, max_value_bytes_per_client=share)
    with serve(fake_engine, tmp_path, limits) as api:
        s = Session(api)
        r = s.call("Read {{doc}} and say hi: {{a}}", [{"name": "doc", "value": doc}, out("a")])
        assert r.status_code == 201, r.text
        got = s.get(r.json()["outputs"]["a"])
        assert got.status_code == 424, got.text
        message = got.json()["error"]["message"]
        assert "max_value_bytes_per_client" in message and "--max-value-bytes-per-client" in message, message
        state = api.get(
            f"/v1/semantic_call/{r.json()['call_id']}", params={"session_id": s.sid}, headers=s.auth
        ).json()
        assert state["state"] == "failed" and "max_value_bytes_per_client" in state["error"], state
        healthy(api)


@pytest.mark.asyncio(loop_scope="function")
async def test_values_count_per_client_and_a_restart_counts_them_again(tmp_path):
    limits = Limits(max_value_chars=1000, max_value_bytes=4 * SIZE + 100, max_value_bytes_per_client=SHARE)
    core = ServeCore(store=Store(sqlite_url(tmp_path)), limits=limits)
    await core.start()
    try:
        budget = core.admission.budget
        a, _ = await core.sessions.create(client="10.0.0.1")
        b, _ = await core.sessions.create(client="10.0.0.2")
        for session in (a, a, b, b):
            await core.vars.create(session, "v", VALUE)
        assert (budget.of_client("10.0.0.1"), budget.of_client("10.0.0.2"), budget.held) == (
            2 * SIZE,
            2 * SIZE,
            4 * SIZE,
        )
        c, _ = await core.sessions.create(client="10.0.0.3")  # within its share, past the server's
        with pytest.raises(InsufficientStorageError, match="max_value_bytes"):
            await core.vars.create(c, "v", VALUE)
        async with Refusal(core.journal.store):  # a create the store refuses gives its bytes back
            with pytest.raises(StoreError):
                await core.vars.create(c, "v", "y" * 10)
        assert budget.held == 4 * SIZE and budget.of_client("10.0.0.3") == 0
        await core.sessions.delete(b)
        assert budget.held == 2 * SIZE and budget.of_client("10.0.0.2") == 0
        await core.vars.create(c, "v", VALUE)
    finally:
        await core.stop()
    again = ServeCore(store=Store(sqlite_url(tmp_path)), limits=limits)
    await again.start()
    try:
        budget = again.admission.budget
        assert budget.held == 3 * SIZE
        assert (budget.of_session(a.session_id), budget.of_session(c.session_id)) == (2 * SIZE, SIZE)
        restored = again.sessions.get(c.session_id)
        await again.vars.create(restored, "v", VALUE)  # the fourth fits
        with pytest.raises(InsufficientStorageError, match="--max-value-bytes"):
            await again.vars.create(restored, "v", VALUE)
        await again.sessions.delete(again.sessions.get(a.session_id))
        assert budget.held == 2 * SIZE
    finally:
        await again.stop()


def test_the_value_memory_limits_come_from_flags_and_variables():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser, {"PARROT_MAX_VALUE_BYTES": "5000"})
    s = ServeSettings.from_args(parser.parse_args(["--max-value-bytes-per-client", "3000"]))
    assert (s.limits.max_value_bytes, s.limits.max_value_bytes_per_client) == (5000, 3000)
    assert (Limits().max_value_bytes, Limits().max_value_bytes_per_client) == (2**30, 256 * 2**20)


def test_small_releases_add_up_to_a_trim():
    """Many small sessions deleted one by one free as much as one big one: a trim follows."""
    budget = ValueBudget(Limits())
    value = "z" * (BIG_RELEASE // 8)
    for n in range(8):
        budget.open(f"s{n}", "10.0.0.1")
        budget.take(f"s{n}", [(f"v{n}", value)])
    assert budget.of_client("10.0.0.1") == 8 * sys.getsizeof(value)
    for n in range(7):
        budget.close(f"s{n}", [f"v{n}"])
    assert budget.big_at is None
    budget.close("s7", ["v7"])
    assert budget.big_at is not None and budget.held == 0 and budget.of_client("10.0.0.1") == 0
