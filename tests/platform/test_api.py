"""The Parrot REST API end to end: DAGs of calls, inputs given later, map-reduce, outputs,
session expiry, the session DAG and engine context-tree routes (on the fake engine); a long
system prompt held once by many sessions, token-exact (on the real engine)."""

from __future__ import annotations

import httpx
import pytest
from rest import ADMIN, api_on_fake_engine, new_session, out, served_api  # noqa: F401  (the api fixture)

from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.core import ServeCore
from parrot.wire.sampling import SamplingParams


def test_chain_of_three_calls_with_one_final_get(api):
    sid, auth = new_session(api)
    r = api.post(
        "/v1/semantic_var", json={"session_id": sid, "name": "topic", "value": "tides"}, headers=auth
    )
    topic = r.json()["var_id"]
    a = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": "One sentence about {{topic}}: {{a}}",
            "parameters": [{"name": "topic", "var_id": topic}, out("a")],
        },
    ).json()
    b = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": "Shorter: {{a}}\nResult: {{b}}",
            "parameters": [{"name": "a", "var_id": a["outputs"]["a"]}, out("b")],
        },
    ).json()
    c = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": "Title for {{b}}: {{c}}",
            "parameters": [{"name": "b", "var_id": b["outputs"]["b"]}, out("c")],
        },
    ).json()
    info = api.get(f"/v1/session/{sid}", headers=auth).json()
    assert [call["call_id"] for call in info["calls"]] == [a["call_id"], b["call_id"], c["call_id"]]
    r = api.get(f"/v1/semantic_var/{c['outputs']['c']}", params={"session_id": sid}, headers=auth)
    assert r.status_code == 200 and r.json()["ready"] and r.json()["value"]
    states = [
        api.get(f"/v1/semantic_call/{x['call_id']}", params={"session_id": sid}, headers=auth).json()["state"]
        for x in (a, b, c)
    ]
    assert states == ["done", "done", "done"]
    assert api.delete(f"/v1/session/{sid}", headers=auth).status_code == 204


def test_inputs_given_by_value_and_put(api):
    sid, auth = new_session(api)
    q = api.post("/v1/semantic_var", json={"session_id": sid, "name": "q"}, headers=auth).json()
    call = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": "{{sys}} Q: {{q}} A: {{a}}",
            "parameters": [
                {"name": "sys", "value": "Be brief."},
                {"name": "q", "var_id": q["var_id"]},
                out("a"),
            ],
        },
    )
    assert call.status_code == 201
    r = api.get(
        f"/v1/semantic_var/{call.json()['outputs']['a']}",
        params={"session_id": sid, "timeout": 0.2},
        headers=auth,
    )
    assert r.status_code == 408 and "no value" in r.json()["error"]["message"]
    assert (
        api.put(
            f"/v1/semantic_var/{q['var_id']}", json={"session_id": sid, "value": "Why?"}, headers=auth
        ).status_code
        == 200
    )
    r = api.get(f"/v1/semantic_var/{call.json()['outputs']['a']}", params={"session_id": sid}, headers=auth)
    assert r.json()["value"]


def test_map_reduce_over_the_api(api):
    """Acceptance 2 over REST: 8 maps feed one reduce; the reduce runs after all maps."""
    sid, auth = new_session(api)
    outputs = []
    for i in range(8):
        call = api.post(
            "/v1/semantic_call",
            headers=auth,
            json={
                "session_id": sid,
                "template": "Summarize: {{part}}\nSummary: {{s}}",
                "parameters": [
                    {"name": "part", "value": f"Chapter {i}: the keeper mends lamp {i}."},
                    out("s", 6),
                ],
            },
        )
        outputs.append(call.json()["outputs"]["s"])
    names = [f"s{i}" for i in range(8)]
    template = "Combine: " + " ".join(f"{{{{{n}}}}}" for n in names) + "\nAll: {{total}}"
    params = [{"name": n, "var_id": v} for n, v in zip(names, outputs, strict=True)] + [out("total", 6)]
    reduce = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={"session_id": sid, "template": template, "parameters": params},
    ).json()
    total = api.get(
        f"/v1/semantic_var/{reduce['outputs']['total']}", params={"session_id": sid}, headers=auth
    )
    assert total.json()["ready"] and total.json()["value"]
    info = api.get(f"/v1/session/{sid}", headers=auth).json()
    assert [c["state"] for c in info["calls"]] == ["done"] * 9


def test_outputs_are_keyed_by_placeholder_and_empty_inputs_fill_nothing(api):
    sid, auth = new_session(api)
    target = api.post("/v1/semantic_var", json={"session_id": sid, "name": "answer"}, headers=auth).json()
    call = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": "Say something {{empty}}: {{out}}",
            "parameters": [
                {"name": "empty", "value": ""},
                {"name": "out", "is_output": True, "var_id": target["var_id"], "sampling": {"max_tokens": 3}},
            ],
        },
    ).json()
    assert call["outputs"] == {"out": target["var_id"]}  # not keyed by the variable's name
    r = api.get(f"/v1/semantic_var/{target['var_id']}", params={"session_id": sid}, headers=auth)
    assert r.status_code == 200 and r.json()["ready"], r.text
    info = api.get(f"/v1/semantic_call/{call['call_id']}", params={"session_id": sid}, headers=auth).json()
    assert info["outputs"] == {"out": target["var_id"]} and info["state"] == "done"


def test_session_dag_and_engine_context_tree_routes(api):
    """GET /v1/session/{id}/dag (session auth): calls go from waiting to done, the maps are
    a task group, templates are filled in. GET /v1/engines/{id}/contexts (admin): the
    shared system prompt is held once, by both sessions."""
    system = "You are the lighthouse keeper's log summarizer. Reply in a few words. " * 3
    sid, auth = new_session(api)
    doc = api.post("/v1/semantic_var", json={"session_id": sid, "name": "doc"}, headers=auth).json()
    maps = []
    for i in range(2):
        call = api.post(
            "/v1/semantic_call",
            headers=auth,
            json={
                "session_id": sid,
                "template": system + f"Part {i} of {{{{doc}}}}: {{{{s}}}}",
                "parameters": [{"name": "doc", "var_id": doc["var_id"]}, out("s", 3)],
            },
        ).json()
        maps.append(call)
    reduce = api.post(
        "/v1/semantic_call",
        headers=auth,
        json={
            "session_id": sid,
            "template": "Join {{a}} and {{b}}: {{total}}",
            "parameters": [
                {"name": "a", "var_id": maps[0]["outputs"]["s"]},
                {"name": "b", "var_id": maps[1]["outputs"]["s"]},
                out("total", 3),
            ],
        },
    ).json()
    assert api.get(f"/v1/session/{sid}/dag").status_code == 401
    other_sid, other_auth = new_session(api)
    assert api.get(f"/v1/session/{sid}/dag", headers=other_auth).status_code == 403
    dag = api.get(f"/v1/session/{sid}/dag", headers=auth).json()
    assert [c["state"] for c in dag["calls"]] == ["waiting"] * 3
    assert {c["group"] for c in dag["calls"][:2]} == {f"group-{dag['calls'][2]['seq']}"}
    assert {"source": doc["var_id"], "target": maps[0]["call_id"]} in dag["edges"]
    assert {"source": reduce["call_id"], "target": reduce["outputs"]["total"]} in dag["edges"]
    assert (
        api.put(
            f"/v1/semantic_var/{doc['var_id']}",
            json={"session_id": sid, "value": "the lamp was lit at dusk"},
            headers=auth,
        ).status_code
        == 200
    )
    total = reduce["outputs"]["total"]
    assert api.get(f"/v1/semantic_var/{total}", params={"session_id": sid}, headers=auth).json()["ready"]
    dag = api.get(f"/v1/session/{sid}/dag", headers=auth).json()
    assert [c["state"] for c in dag["calls"]] == ["done"] * 3
    first = dag["calls"][0]
    assert first["engine"] and first["timings"]["finished_at"] >= first["timings"]["started_at"]
    assert first["sampling"]["s"]["max_tokens"] == 3
    parts = {p["kind"]: p for p in first["template"]}
    assert parts["input"]["text"] == "the lamp was lit at dusk" and parts["output"]["text"] is not None
    # A second session with the same system prompt shares its context on the engine.
    call = api.post(
        "/v1/semantic_call",
        headers=other_auth,
        json={"session_id": other_sid, "template": system + "Again: {{s}}", "parameters": [out("s", 2)]},
    ).json()
    api.get(f"/v1/semantic_var/{call['outputs']['s']}", params={"session_id": other_sid}, headers=other_auth)
    engine_id = first["engine"]
    assert api.get(f"/v1/engines/{engine_id}/contexts").status_code == 401
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert api.get("/v1/engines/engine-404/contexts", headers=admin).status_code == 404
    tree = api.get(f"/v1/engines/{engine_id}/contexts", headers=admin).json()
    assert tree["contexts"] > 0 and tree["nodes"]
    assert any({sid, other_sid} <= set(n["sessions"]) and n["shared"] for n in tree["nodes"])
    for n in tree["nodes"]:
        assert n["subtree_tokens"] >= n["tokens"] > 0
    for s, a in ((sid, auth), (other_sid, other_auth)):
        assert api.delete(f"/v1/session/{s}", headers=a).status_code == 204
    # A closed session's DAG stays visible to the dashboard (as it was), not to the API.
    assert api.get(f"/v1/session/{sid}/dag", headers=auth).status_code == 404


@pytest.mark.asyncio(loop_scope="function")
async def test_idle_sessions_expire_and_free_their_contexts(fake_engine):
    core = ServeCore(session_timeout_s=60)
    await core.start()
    try:
        slot = await core.engines.register_builtin(fake_engine.url)
        session, _ = await core.sessions.create()
        _, outputs = await core.calls.submit(
            session,
            "Hello {{who}}: {{a}}",
            [
                Binding(name="who", value="Ada"),
                Binding(name="a", is_output=True, sampling=SamplingParams(max_tokens=2)),
            ],
            [],
            None,
        )
        await core.vars.get(session, outputs["a"], "latency", 60)
        mine = [c.context_id for c in core.contexts.tree(slot).of_session(session.session_id)]
        assert mine
        active, active_auth = await core.sessions.create()
        session.last_active -= 61  # idle for longer than the timeout (no sleeping in tests)
        active.last_active -= 61
        core.sessions.open(active.session_id, active_auth)  # touched: stays
        assert await core.sessions.expire_idle() == [session.session_id]
        assert session.session_id not in core.sessions and active.session_id in core.sessions
        # Its contexts are gone, here and on the engine (freeing them again frees nothing);
        # a prefix of constant template text may stay cached for other sessions.
        assert not core.contexts.tree(slot).of_session(session.session_id)
        for cid in mine:
            assert await slot.client.free_context(cid) == 0
    finally:
        await core.stop()


@pytest.fixture
def real_api(request, engine_server, tmp_path):
    with served_api(request, "sqlite", engine_server.url, tmp_path) as client:
        yield client


def test_sessions_sharing_a_long_system_prompt_hold_it_once(real_api, engine_server):
    """Acceptance 3: 8 sessions, one long constant system prompt: the engine holds it once,
    and every output equals the one an unshared context of the same tokens produces (the
    real engine's /v1/completions)."""
    api = real_api
    system = "You are the harbour master's assistant. Keep answers short and factual. " * 30
    template = system + "\nUser: {{q}}\nAssistant: {{a}}"
    engine = httpx.Client(base_url=engine_server.url, timeout=120)
    before = engine.get("/ping").json()["kv_blocks_used"]
    answers = []
    for n in range(8):
        sid, auth = new_session(api)
        call = api.post(
            "/v1/semantic_call",
            headers=auth,
            json={
                "session_id": sid,
                "template": template,
                "parameters": [{"name": "q", "value": f"Question {n}: when is high tide?"}, out("a", 6)],
            },
        ).json()
        r = api.get(f"/v1/semantic_var/{call['outputs']['a']}", params={"session_id": sid}, headers=auth)
        answers.append(r.json()["value"])
    held = engine.get("/ping").json()["kv_blocks_used"] - before
    prefix_tokens = len(engine.post("/tokenize", json={"text": system + "\nUser: "}).json()["token_ids"])
    prefix_blocks = prefix_tokens // 16
    assert prefix_blocks >= 20
    assert held < prefix_blocks + 8 * 4  # the prefix once, plus a few blocks per session
    # Token-exact: each output is what the engine's own /v1/completions gives for the
    # rendered prompt (the whole text tokenized at once, no context shared).
    for n, answer in enumerate(answers):
        rendered = f"{system}\nUser: Question {n}: when is high tide?\nAssistant: "
        alone = engine.post(
            "/v1/completions", json={"prompt": rendered, "max_tokens": 6, "temperature": 0}
        ).json()
        assert alone["choices"][0]["text"] == answer
    engine.close()
