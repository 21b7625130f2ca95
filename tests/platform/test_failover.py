"""Two engines; one dies mid-workload: every call still completes on the other."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from conftest import ServerThread
from test_executor import App

from parrot.engines.builtin.config import EngineConfig
from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.server.app import create_app
from parrot.platform.serve.context_manager import ContextTree
from parrot.platform.serve.engine_client import HttpEngine
from parrot.platform.serve.executor import EngineSlot, GlobalScheduler
from parrot.platform.serve.variables import Variables

pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture(scope="module")
def doomed_engine(engine, engine_config):
    eng = BuiltinEngine(EngineConfig(cache_dir=engine_config.cache_dir, kv_cache_bytes=64 * 2**20))
    yield eng
    eng.stop()


async def test_calls_complete_when_an_engine_dies(engine_server, engine, doomed_engine, ids):
    doomed = ServerThread(create_app(doomed_engine, manage_engine=False)).__enter__()
    survivor_client, doomed_client = HttpEngine(engine_server.url), HttpEngine(doomed.url)
    scheduler = GlobalScheduler(Variables())
    for name, client in (("survivor", survivor_client), ("doomed", doomed_client)):
        scheduler.add_engine(
            EngineSlot(name, engine.model_name, client, ContextTree(client, ids), capacity=2)
        )
    assigned = []
    scheduler.on_done = lambda task: assigned.append(task.engine_id)
    scheduler.start(monitor_interval_s=0.5)
    app = App(scheduler, "fo", itertools.count())
    try:
        for i in range(8):
            app.var(f"x{i}", f"Item {i}: a lamp, a rope and a bell.")
            app.call(f"List the objects in: {{{{x{i}}}}}\nObjects: {{{{y{i}}}}}", f"y{i}")
        # Let both engines start on the work, then kill one of them.
        while scheduler.engines["doomed"].running == 0 or scheduler.engines["survivor"].running == 0:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(doomed.__exit__, None, None, None)
        values = await asyncio.gather(*(scheduler.variables.wait(app.vars[f"y{i}"], 180) for i in range(8)))
        assert all(values)
        assert not scheduler.engines["doomed"].up
        assert assigned.count("survivor") >= 6  # the doomed engine's tasks moved over
    finally:
        await scheduler.stop()
        await scheduler.engines["survivor"].tree.evict(0)
        await survivor_client.aclose()
        await doomed_client.aclose()


async def test_with_every_engine_down_the_variables_fail_clearly(ids):
    from conftest import free_port

    client = HttpEngine(f"http://127.0.0.1:{free_port()}")
    scheduler = GlobalScheduler(Variables())
    scheduler.add_engine(EngineSlot("gone", "m", client, ContextTree(client, ids)))
    scheduler.start(monitor_interval_s=None)
    app = App(scheduler, "down", itertools.count())
    app.var("x", "hello")
    app.call("Echo {{x}}: {{y}}", "y")
    try:
        with pytest.raises(Exception, match="every engine that serves them is down"):
            await scheduler.variables.wait(app.vars["y"], 30)
    finally:
        await scheduler.stop()
        await client.aclose()
