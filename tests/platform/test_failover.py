"""Engines that die (SIGKILL) or hang (SIGSTOP) mid-workload: their tasks move to another
engine, or fail with a clear reason, in bounded time; an engine that comes back is used again
and what it held is freed. Real ``parrot engine`` processes die; fake engines in processes of
their own (tests/fake_engine/process.py, no model to load) hang and come back."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest
from fake_engine.process import FakeEngineProcess
from servers import ChildProcess, ParrotProcess, free_port

from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import ProducerFailedError
from parrot.platform.serve.scheduler.health import HealthSettings
from parrot.wire.sampling import SamplingParams

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.spawns]
# Pinged every 0.3 s, down after 2 missed pings of 0.5 s: an engine is found dead in ~1-2 s.
HEALTH = HealthSettings(interval_s=0.3, timeout_s=0.5, max_missed=2, down_grace_s=4.0)
DETECTION_BOUND_S = 15.0  # generous on a loaded 2-core machine; the settings give ~2 s


def engine_process(request: pytest.FixtureRequest, kind: str) -> tuple[ChildProcess, str]:
    """A real ``parrot engine`` (the default model), or a fake engine whose tokens take 20 ms
    (a call of 48 tokens runs for about a second), each in a process of its own."""
    if kind == "fake":
        fake = FakeEngineProcess(step_s=0.02)
        return fake, fake.url
    port = free_port()
    env = {**os.environ, "PARROT_CACHE_DIR": str(request.getfixturevalue("model_cache_dir"))}
    process = ParrotProcess(["engine", "--port", str(port), "--kv-cache-memory", "128MiB"], env)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(lambda: httpx.get(f"{url}/ping", timeout=2).status_code == 200, "parrot engine")
    return process, url


async def submit(core: ServeCore, n: int, max_tokens: int = 48) -> tuple:
    session, _ = await core.sessions.create()
    outputs = []
    for i in range(n):
        params = [
            Binding(name="x", value=f"Voyage {i} of the lighthouse tender"),
            Binding(
                name="y",
                is_output=True,
                sampling=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
            ),
        ]
        _, out = await core.calls.submit(session, "Log of {{x}}: {{y}}", params, [], None)
        outputs.append(out["y"])
    return session, outputs


async def running_on(core: ServeCore, engine_id: str) -> None:
    while not core.scheduler.engines[engine_id].running:
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "how, kind", [(signal.SIGKILL, "real"), (signal.SIGSTOP, "fake")], ids=["sigkill-real", "sigstop-fake"]
)
async def test_tasks_of_a_lost_engine_finish_on_another(request, how, kind):
    first, first_url = engine_process(request, kind)
    if kind == "real":  # the spare: the tests' own real engine (one model load fewer)
        second, second_url = None, request.getfixturevalue("engine_server").url
    else:
        second, second_url = engine_process(request, kind)
    core = ServeCore(health=HEALTH)
    try:
        await core.start()
        doomed = (await core.engines.register_builtin(first_url)).engine_id
        session, outputs = await submit(core, 4)
        await running_on(core, doomed)
        spare = (await core.engines.register_builtin(second_url)).engine_id
        os.kill(first.proc.pid, how)
        lost_at = time.monotonic()
        while core.scheduler.engines[doomed].up:  # found by its missed pings, not a timeout
            assert time.monotonic() - lost_at < DETECTION_BOUND_S
            await asyncio.sleep(0.05)
        values = [(await core.vars.get(session, v, "latency", 300)).value for v in outputs]
        assert all(values)
        assert {r.engine_id for r in session.calls.values()} == {spare}
        if how == signal.SIGSTOP:
            # It was only stopped: once it runs again it is up, and its old contexts are freed.
            os.kill(first.proc.pid, signal.SIGCONT)
            while not core.scheduler.engines[doomed].up:
                await asyncio.sleep(0.1)
            # Requests it had buffered while stopped are dropped (their client is gone), and
            # what its earlier contexts held is freed: it drains to nothing.
            async with httpx.AsyncClient() as client:
                resumed = time.monotonic()
                while (info := (await client.get(f"{first_url}/ping")).json())["num_contexts"]:
                    assert time.monotonic() - resumed < DETECTION_BOUND_S, info
                    await asyncio.sleep(0.2)
                assert info["num_running"] == info["num_waiting"] == 0
            again, more = await submit(core, 1, max_tokens=4)  # and it serves again
            await core.vars.get(again, more[0], "latency", 60)
    finally:
        await core.stop()
        for process in (first, second):
            if process is not None and process.proc.poll() is None:
                os.kill(process.proc.pid, signal.SIGCONT)
                process.kill()


async def test_tasks_of_a_lone_hung_engine_fail_with_the_reason_in_bounded_time(request):
    process, url = engine_process(request, "fake")
    core = ServeCore(health=HEALTH)
    try:
        await core.start()
        engine_id = (await core.engines.register_builtin(url)).engine_id
        session, outputs = await submit(core, 2, max_tokens=400)
        await running_on(core, engine_id)
        os.kill(process.proc.pid, signal.SIGSTOP)  # the port stays open: no connection error
        stopped = time.monotonic()
        for var_id in outputs:
            with pytest.raises(ProducerFailedError, match="every engine that serves them is down"):
                await core.vars.get(session, var_id, "latency", 120)
        # Detection (missed pings) plus the grace for an engine to come back, not an HTTP timeout.
        assert time.monotonic() - stopped < DETECTION_BOUND_S + HEALTH.down_grace_s
    finally:
        await core.stop()
        os.kill(process.proc.pid, signal.SIGCONT)
        process.kill()
