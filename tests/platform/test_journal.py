"""Nothing is acknowledged that is not stored: a database that refuses writes fails the
request (503, with the reason) and leaves no trace of it; the server keeps serving."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from parrot.platform.serve.calls.service import Binding
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import StoreError
from parrot.platform.store.store import Store, sqlite_url


def _read_only(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA query_only = 1")  # every write fails: "attempt to write a readonly database"
    cursor.close()


class Refusal:
    """Makes a real SQLite store refuse writes (and take them again)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def __aenter__(self) -> None:
        event.listen(self.store.engine.sync_engine, "connect", _read_only)
        await self.store.engine.dispose()  # new connections get the pragma

    async def __aexit__(self, *exc) -> None:
        event.remove(self.store.engine.sync_engine, "connect", _read_only)
        await self.store.engine.dispose()


@pytest.mark.asyncio(loop_scope="function")
async def test_a_refused_write_fails_the_request_and_changes_nothing(fake_engine, tmp_path):
    store = Store(sqlite_url(tmp_path))
    core = ServeCore(store=store)
    await core.start()
    try:
        await core.engines.register_builtin(fake_engine.url)
        session, _ = await core.sessions.create()
        topic = await core.vars.create(session, "topic", "tides")
        waiting = await core.vars.create(session, "later")
        generated = (await core.engines.slots()[0].client.ping())["tokens_generated"]
        params = [Binding(name="t", var_id=topic.var_id), Binding(name="a", is_output=True)]
        async with Refusal(store):
            with pytest.raises(StoreError, match="did not take the write"):
                await core.sessions.create()
            with pytest.raises(StoreError):
                await core.vars.create(session, "x", "y")
            with pytest.raises(StoreError):
                await core.calls.submit(session, "About {{t}}: {{a}}", params, [], None)
            with pytest.raises(StoreError):
                await core.vars.set(session, waiting.var_id, "now")
        # Nothing of the refused requests exists, nothing ran on the engine.
        assert list(core.sessions) == [session.session_id]
        assert set(session.vars) == {topic.var_id, waiting.var_id} and not session.calls
        assert not waiting.ready and not topic.consumers
        assert (await core.engines.slots()[0].client.ping())["tokens_generated"] == generated
        # Writes are taken again: the same requests now work, and what was told is stored.
        request, out = await core.calls.submit(session, "About {{t}}: {{a}}", params, [], None)
        await core.vars.set(session, waiting.var_id, "now")
        await core.vars.get(session, out["a"], "latency", 120)
        stored = await store.snapshot()
        assert request.call_id in {c.call_id for c in stored.calls}
        assert {v.var_id: v.value for v in stored.vars}[waiting.var_id] == "now"
    finally:
        await core.stop()
