"""The builtin engine that ``parrot serve`` started in an earlier run is replaced, not kept
(issue 24): after ``make run ENGINE_PORT=...`` on the same database, the old engine's record
stayed listed, down, for good, beside the new one. Engines registered by hand stay.

Each run is a ServeCore on the same SQLite file; the engine it "started" is the test's real
engine, reached under another URL in each run (``127.0.0.1`` and ``localhost``)."""

from __future__ import annotations

import httpx
import pytest
from conftest import free_port, parrot_process, serve_env

from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.engines.registry import OPENAI, EngineSpec
from parrot.platform.store.store import Store, sqlite_url


async def run(tmp_path, own: str | None, *, by_hand: EngineSpec | None = None) -> dict[str, str]:
    """One run of ``parrot serve`` that started the engine at ``own``; its engines by URL
    (-> engine id), as listed and as stored."""
    core = ServeCore(store=Store(sqlite_url(tmp_path)))
    await core.start(() if own is None else (own,), own)
    try:
        if by_hand is not None:
            await core.engines.register(by_hand)
        await core.journal.flush()  # the records of engines registered at start
        listed = {view.url: view.engine_id for view in core.views.engine_views()}
        stored = {r.url: r.engine_id for r in (await core.journal.store.snapshot()).engines}
        assert listed == stored, (listed, stored)
        return listed
    finally:
        await core.stop()


@pytest.mark.asyncio(loop_scope="function")
async def test_the_engine_an_earlier_run_started_is_replaced(engine_server, engine, tmp_path):
    first = engine_server.url  # http://127.0.0.1:PORT
    second = first.replace("127.0.0.1", "localhost")  # another port, as it were
    endpoint = EngineSpec(OPENAI, f"{first}/v1", model=engine.model_name, api="completions")
    engines = await run(tmp_path, first, by_hand=endpoint)
    assert set(engines) == {first, f"{first}/v1"}
    # The next run started its engine elsewhere: the old one is gone, the one by hand stays.
    engines = await run(tmp_path, second)
    assert set(engines) == {second, f"{first}/v1"}, engines
    # A builtin engine registered by hand stays too, and the own engine keeps its id.
    again = await run(tmp_path, second, by_hand=EngineSpec("builtin", first))
    assert again[second] == engines[second] and set(again) == {second, first, f"{first}/v1"}
    # A run that starts no engine (``--no-engine``, ``--engine URL``) drops the stale one too.
    assert set(await run(tmp_path, None)) == {first, f"{first}/v1"}


def test_serve_on_another_engine_port_lists_only_its_new_engine(engine, tmp_path, tiny_model):
    """As ``make run`` then ``make run ENGINE_PORT=...`` on the same data folder: the second
    run lists one engine, its own, up (before: the first run's too, down for good). Its
    engines serve the tiny model."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = serve_env(engine, tmp_path, "own-engine-token", model=tiny_model)
    admin = {"Authorization": "Bearer own-engine-token"}

    def ready() -> bool:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("engines_up") == 1

    for engine_port in (free_port(), free_port()):
        with parrot_process(
            ["serve", "--port", str(port), "--engine-port", str(engine_port)], env, ready, "serve"
        ):
            engines = httpx.get(f"{url}/v1/engines", headers=admin, timeout=10).json()
            assert [(e["url"], e["up"]) for e in engines] == [(f"http://127.0.0.1:{engine_port}", True)], (
                engines
            )
