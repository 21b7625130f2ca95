"""A big session does not stall the server through the dashboard (issue 24, defect 2):
drawing is bounded (the latest MAX_DRAWN_CALLS calls; the counts cover all) and linear,
and a live page's render is made once per interval for all its subscribers, in a worker
thread, while its snapshot is taken on the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from conftest import ServerThread
from httpx_sse import connect_sse

from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.ops.observe import DagCall, DagEdge, DagVar, DisplayState, SessionDag
from parrot.web import live, render, views
from parrot.web.app import create_server_app


def big_dag(calls: int) -> SessionDag:
    """A chain-and-fan DAG of ``calls`` finished calls that overlapped in time."""
    t0 = time.time() - 100
    dag_calls, dag_vars, edges = [], [], []
    for i in range(calls):
        inputs = [f"v{i - 1}"] if i % 4 else []
        timings = {
            "submitted_at": t0 + i * 0.01,
            "started_at": t0 + i * 0.01 + 0.5,
            "finished_at": t0 + i * 0.01 + 5,
        }
        engine = f"engine-{i % 2}"
        call = DagCall(
            f"c{i}", i, "llm", DisplayState.DONE, engine, inputs, [f"v{i}"], False, None, timings, None, []
        )
        dag_calls.append(call)
        dag_vars.append(DagVar(f"v{i}", f"out{i}", "ready", "x", None, f"c{i}", []))
        edges += [DagEdge(p, f"c{i}") for p in inputs] + [DagEdge(f"c{i}", f"v{i}")]
    return SessionDag("big", True, dag_calls, dag_vars, edges)


def test_a_huge_session_draws_its_latest_calls_and_counts_all():
    graph = big_dag(10_000)
    page = views.session_page(graph, selected="c17")  # a node not drawn still has its detail
    assert page.drawn_calls == views.MAX_DRAWN_CALLS
    assert page.states[DisplayState.DONE] == 10_000
    assert page.svg.count('class="node call') == views.MAX_DRAWN_CALLS
    assert 'data-node="c9999"' in page.svg and 'data-node="c17"' not in page.svg
    assert page.detail is not None and page.detail.call.call_id == "c17"
    html = render.fragment("live/session.html", model=page)
    assert f"the latest {views.MAX_DRAWN_CALLS} of 10000 calls" in html
    assert len(html) < 1_000_000  # 10,000 drawn calls were 9.5 MB


def test_a_small_session_is_drawn_whole():
    page = views.session_page(big_dag(50))
    assert page.drawn_calls == 50 and page.svg.count('class="node call') == 50


def test_subscribers_share_one_render_made_off_the_event_loop():
    shared = live.SharedRenders()
    snapshots, draws = [], []
    loop_thread = threading.get_ident()

    def snapshot():
        snapshots.append(threading.get_ident())
        return len(snapshots)

    def draw(state):
        draws.append(threading.get_ident())
        time.sleep(0.05)
        return f"page {state}"

    async def main():
        first = await asyncio.gather(*(shared.get("k", snapshot, draw, 1.0) for _ in range(8)))
        again = await shared.get("k", snapshot, draw, 1.0)  # within the interval: the same render
        await asyncio.sleep(0.2)
        later = await shared.get("k", snapshot, draw, 0.1)  # older than max_age: a new one
        return first, again, later

    first, again, later = asyncio.run(main())
    assert first == ["page 1"] * 8 and again == "page 1" and later == "page 2"
    assert len(draws) == 2 and all(t != loop_thread for t in draws)
    assert snapshots == [loop_thread, loop_thread]


def test_a_failed_snapshot_reaches_its_caller_and_is_not_kept():
    shared = live.SharedRenders()

    def gone():
        raise LookupError("session gone")

    async def main():
        with pytest.raises(LookupError):
            await shared.get("k", gone, str, 10.0)
        return await shared.get("k", lambda: 1, str, 10.0)

    assert asyncio.run(main()) == "1"


def test_the_live_session_page_over_http(engine_server):
    """A real session: its bounded snapshot keeps the latest calls (and the selected node),
    its counts cover every call, its live page streams, and the server stays healthy."""
    core = ServeCore()
    app = create_server_app(core, engine_urls=(engine_server.url,))
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as api:
        s = api.post("/v1/session").json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        calls = []
        for i in range(10):
            body = {
                "session_id": sid,
                "inputs": [{"value": f"t{i}"}],
                "steps": [{"type": "upper"}],
                "output": "u",
            }
            r = api.post("/v1/semantic_transform", json=body, headers=auth)
            assert r.status_code == 201, r.text
            calls.append(r.json()["call_id"])
        latest = core.views.session_dag(sid, latest=3, keep=calls[0])
        assert [c.call_id for c in latest.calls] == [calls[0], *calls[-3:]]
        touched = {v for c in latest.calls for v in (*c.inputs, *c.outputs)}
        assert {v.var_id for v in latest.vars} == touched  # the variables of the kept calls only
        assert sum(core.views.state_counts(sid)().values()) == 10
        with connect_sse(api, "GET", f"/live/sessions/{sid}") as source:
            assert source.response.status_code == 200
            assert any("DAG" in event.data for event in source.iter_sse())
        assert api.get("/live/sessions/nope").status_code == 404
        assert api.get("/healthz").status_code == 200
        assert api.get(f"/sessions/{sid}").status_code == 200
