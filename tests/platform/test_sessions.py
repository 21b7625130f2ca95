"""Sessions and their variables: no state keyed by object addresses, and a session that goes
(deleted or expired) stops its work on the engines and frees what it held there (on the
fake engine, and deleted on the real one)."""

from __future__ import annotations

import asyncio
import gc

import httpx
import pytest
import pytest_asyncio
from conftest import ServerThread
from waiting import until

from parrot.platform.api.app import create_app
from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import SessionClosedError, WaitTimeoutError
from parrot.wire.sampling import SamplingParams

LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)


@pytest.mark.asyncio(loop_scope="function")
async def test_fresh_variables_are_never_ready_whatever_lived_at_their_address():
    """Readiness used to be kept in a table keyed by ``id(var)`` and never dropped: a new
    variable at a reused address was 'ready' with ''. 2,000 variables with values come and
    go with their sessions; the 2,000 made after them have no value and wait."""
    core = ServeCore()
    for _ in range(20):
        session, _ = await core.sessions.create()
        for n in range(100):
            var = await core.vars.create(session, f"v{n}", "a value")
            await core.vars.get(session, var.var_id, "throughput", 0)  # waited on: its event exists
        await core.sessions.delete(session)
    gc.collect()
    fresh = []
    for _ in range(20):
        session, _ = await core.sessions.create()
        fresh += [(session, (await core.vars.create(session, f"w{n}")).var_id) for n in range(100)]
    for session, var_id in fresh:
        with pytest.raises(WaitTimeoutError):
            await core.vars.get(session, var_id, "throughput", 0)


def test_fresh_variables_over_the_api_answer_408_not_an_empty_value(fake_engine, tmp_path):
    app = create_app(ServeCore(), engine_urls=(fake_engine.url,), admin_token="a")
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as api:
        for round_ in range(2):  # the first round's variables are gone before the second's
            answers = []
            for _ in range(6):
                s = api.post("/v1/session").json()
                auth = {"Authorization": f"Bearer {s['session_auth']}"}
                for n in range(40):
                    body = {"session_id": s["session_id"], "name": f"v{n}"}
                    if round_ == 0:
                        body["value"] = "set"
                    var = api.post("/v1/semantic_var", json=body, headers=auth).json()
                    r = api.get(
                        f"/v1/semantic_var/{var['var_id']}",
                        params={"session_id": s["session_id"], "timeout": 0},
                        headers=auth,
                    )
                    answers.append(r.status_code)
                api.delete(f"/v1/session/{s['session_id']}", headers=auth)
            assert set(answers) == ({200} if round_ == 0 else {408}), answers


@pytest_asyncio.fixture(loop_scope="function")
async def core(engine_url, request):
    if "fake_engine" in request.fixturenames:
        request.getfixturevalue("fake_engine").engine.step_s = 0.005  # long generations take 2 s
    core = ServeCore(session_timeout_s=60)
    await core.start()
    await core.engines.register_builtin(engine_url)
    yield core
    await core.stop()


async def engine_info(core) -> dict:
    return await core.engines.slots()[0].client.ping()


async def busy_session(core):
    """A session with two long generations running and a call queued behind one of them."""
    session, _ = await core.sessions.create()
    outs = []
    for n in range(2):
        params = [
            Binding(name="x", value=f"tale {n}"),
            Binding(name="y", is_output=True, sampling=LONG),
        ]
        _, out = await core.calls.submit(session, "A long {{x}}: {{y}}", params, [], None)
        outs.append(out["y"])
    params = [Binding(name="y", var_id=outs[0]), Binding(name="z", is_output=True, sampling=LONG)]
    _, out = await core.calls.submit(session, "Continue {{y}} -> {{z}}", params, [], None)
    outs.append(out["z"])
    await until(lambda: running(core, 2), what="two generations running")
    return session, outs


async def running(core, n: int) -> bool:
    return (await engine_info(core))["num_running"] >= n


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.parametrize(
    "how, engine_url", [("delete", "fake"), ("expire", "fake"), ("delete", "real")], indirect=["engine_url"]
)
async def test_a_session_that_goes_stops_its_work_and_frees_its_contexts(core, how):
    before = await engine_info(core)
    session, outs = await busy_session(core)
    waiter = asyncio.create_task(core.vars.get(session, outs[2], "throughput", 120))
    if how == "delete":
        await core.sessions.delete(session)
    else:
        session.last_active -= 61  # idle past the timeout (no sleeping in tests)
        assert await core.sessions.expire_idle() == [session.session_id]
    # Its generations were aborted on the engine, not left to run their 400 tokens.
    after = await engine_info(core)
    assert after["num_running"] == after["num_waiting"] == 0
    generated = after["tokens_generated"]
    assert generated - before["tokens_generated"] < 2 * 400
    # Whoever waited on its variables hears why.
    with pytest.raises(SessionClosedError, match="deleted"):
        await waiter
    # Nothing of it is left on the engine, and the queued call never runs.
    assert after["num_contexts"] <= before["num_contexts"] + 1  # a shared template prefix may stay
    assert not core.contexts.tree(core.engines.slots()[0]).of_session(session.session_id)
    # A call of another session submitted after it runs; the queued call did not, before it
    # or along with it: nothing was generated beyond that call's tokens.
    other, _ = await core.sessions.create()
    params = [
        Binding(name="q", value="ok"),
        Binding(name="a", is_output=True, sampling=SamplingParams(max_tokens=3, ignore_eos=True)),
    ]
    _, out = await core.calls.submit(other, "Then {{q}}: {{a}}", params, [], None)
    await core.vars.get(other, out["a"], "throughput", 120)
    assert (await engine_info(core))["tokens_generated"] == generated + 3
