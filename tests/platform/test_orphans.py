"""Contexts a killed ServeCore left on an engine (issue 14, item 7): freed when the ServeCore
starts again, while another ServeCore's contexts on the same engine are kept."""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import free_port
from test_restart import start_servecore, submit_chain

from parrot.platform.serve.contexts.orphans import REGIONS_KEPT, claim_region, region_range
from parrot.platform.store.store import Store


def engine_load(engine_url: str) -> tuple[int, int]:
    info = httpx.get(f"{engine_url}/ping", timeout=5).json()
    return info["num_contexts"], info["kv_blocks_used"]


def run_chain_to_the_end(api: httpx.Client, topic: str) -> tuple[str, dict, list[dict]]:
    s = api.post("/v1/session").json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
    calls = submit_chain(api, sid, auth, topic, 4)
    loud = calls[-1]["outputs"]["loud"]
    r = api.get(f"/v1/semantic_var/{loud}", params={"session_id": sid, "timeout": 120}, headers=auth)
    assert r.status_code == 200 and r.json()["ready"], r.text
    return sid, auth, calls


def test_a_restarted_servecore_frees_what_its_killed_run_left_on_the_engine(engine_server, tmp_path):
    # Another ServeCore on the same engine, with its own database, holding contexts.
    other_port = free_port()
    other = start_servecore(other_port, engine_server.url, f"sqlite+aiosqlite:///{tmp_path / 'other.db'}")
    port = free_port()
    db = f"sqlite+aiosqlite:///{tmp_path / 'parrot.db'}"
    first = None
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{other_port}", timeout=120) as api:
            run_chain_to_the_end(api, "harbours")
        time.sleep(0.5)
        baseline = engine_load(engine_server.url)
        assert baseline[0] > 0  # the other ServeCore's contexts are on the engine

        first = start_servecore(port, engine_server.url, db)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as api:
            sessions = [run_chain_to_the_end(api, topic) for topic in ("tides", "glaciers")]
        live = engine_load(engine_server.url)
        assert live[0] > baseline[0] and live[1] > baseline[1], (baseline, live)
        first.kill()  # SIGKILL: its contexts stay on the engine, nobody's now
        assert engine_load(engine_server.url) == live

        first = start_servecore(port, engine_server.url, db)
        deadline = time.monotonic() + 10
        while engine_load(engine_server.url) != baseline and time.monotonic() < deadline:
            time.sleep(0.2)
        # The killed run's contexts and KV are gone; the other ServeCore's are all there.
        assert engine_load(engine_server.url) == baseline, (baseline, live)
        with httpx.Client(base_url=f"http://127.0.0.1:{other_port}", timeout=120) as api:
            run_chain_to_the_end(api, "harbours")  # its cached contexts still serve it
        # The restored sessions work on: a new chain in one of them runs to the end.
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as api:
            sid, auth, _ = sessions[0]
            calls = submit_chain(api, sid, auth, "tides again", 4)
            loud = calls[-1]["outputs"]["loud"]
            r = api.get(f"/v1/semantic_var/{loud}", params={"session_id": sid, "timeout": 120}, headers=auth)
            assert r.status_code == 200 and r.json()["ready"], r.text
    finally:
        if first is not None and first.proc.poll() is None:
            first.stop()
        other.stop()


@pytest.mark.asyncio(loop_scope="function")
async def test_each_run_claims_a_new_region_and_learns_the_earlier_ones(db_url):
    """On SQLite and PostgreSQL: the regions of the latest runs are kept in the store."""
    store = Store(db_url)
    await store.migrate()
    try:
        runs = [await claim_region(store) for _ in range(REGIONS_KEPT + 3)]
    finally:
        await store.close()
    regions = [region for region, _ in runs]
    assert len(set(regions)) == len(regions)
    assert runs[0][1] == () and runs[1][1] == (regions[0],)
    assert runs[-1][1] == tuple(reversed(regions[-1 - REGIONS_KEPT : -1]))  # the latest, newest first
    start, end = region_range(regions[0])
    assert start >= 2**48 and end - start == 2**48 and end <= 2**62
