"""Nothing is acknowledged that is not stored: a database that refuses writes fails the
request (503, with the reason) and leaves no trace of it; the server keeps serving."""

from __future__ import annotations

import pytest
import pytest_asyncio
from sqlalchemy import event

from parrot.platform.serve import journal as journal_module
from parrot.platform.serve.calls.service import Binding, CallRequest
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.errors import StoreError
from parrot.platform.serve.journal import Journal
from parrot.platform.store.models import call_record, var_record
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


@pytest_asyncio.fixture(loop_scope="function")
async def served(fake_engine, tmp_path):
    """A ServeCore on a real SQLite store and the fake engine, with a stored session."""
    store = Store(sqlite_url(tmp_path))
    core = ServeCore(store=store)
    await core.start()
    try:
        await core.engines.register_builtin(fake_engine.url)
        session, _ = await core.sessions.create()
        yield core, store, session
    finally:
        fake_engine.engine.hang = False
        await core.stop()


@pytest.mark.asyncio(loop_scope="function")
async def test_a_refused_write_fails_the_request_and_changes_nothing(served):
    core, store, session = served
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


@pytest.mark.asyncio(loop_scope="function")
async def test_writes_queued_together_are_committed_together(tmp_path):
    """Group commit: what is queued while the writer is busy goes in one transaction, in
    order (a session's calls, then their state changes)."""
    store = Store(sqlite_url(tmp_path))
    await store.migrate()
    commits = []
    event.listen(store.engine.sync_engine, "commit", lambda _conn: commits.append(1))
    journal = Journal(store)
    journal.start()
    try:
        made = [journal.record(lambda s, i=i: s.add_session(f"s{i}", "hash")) for i in range(50)]
        touched = journal.record(lambda s: s.touch_session("s7"))
        await journal.commit(*made, touched)
        assert len(commits) == 1
        stored = await store.sessions()
        assert sorted(r.session_id for r in stored) == sorted(f"s{i}" for i in range(50))
        seven = next(r for r in stored if r.session_id == "s7")
        assert seven.last_active_at > seven.created_at  # applied after its creation
    finally:
        await journal.stop()
        await store.close()


@pytest.mark.asyncio(loop_scope="function")
async def test_sessions_with_their_calls_and_states_commit_together(tmp_path):
    """Rows of several tables in one batch go in the order written: the unit of work would
    insert a session's calls before the session (a foreign key fails, and every write of
    the batch then took a commit of its own: concurrent applications, every time)."""
    store = Store(sqlite_url(tmp_path))
    await store.migrate()
    commits, batches_undone = [], []
    event.listen(store.engine.sync_engine, "commit", lambda _conn: commits.append(1))
    event.listen(store.engine.sync_engine, "rollback", lambda _conn: batches_undone.append(1))
    journal = Journal(store)
    journal.start()
    try:
        writes = []
        for app in range(4):
            sid = f"app{app}"
            call = call_record(f"call-{app}", sid, app, "Write {{code}}", [])
            writes.append(journal.record(lambda s, sid=sid: s.add_session(sid, "hash")))
            var = var_record(f"v{sid}", sid, "code")
            writes.append(journal.record(lambda s, c=call, v=var: s.add_calls([c], [v])))
            writes.append(journal.record(lambda s, c=call: s.update_call(c["call_id"], state="running")))
            writes.append(journal.record(lambda s, sid=sid: s.set_var_value(f"v{sid}", "def f(): ...")))
        await journal.commit(*writes)
        assert len(commits) == 1 and not batches_undone
        stored = await store.snapshot()
        assert sorted(c.state for c in stored.calls) == ["running"] * 4
        assert sorted(v.value for v in stored.vars) == ["def f(): ..."] * 4
    finally:
        await journal.stop()
        await store.close()


@pytest.mark.asyncio(loop_scope="function")
async def test_a_bad_write_in_a_batch_fails_alone(tmp_path, monkeypatch):
    """The batch's transaction is undone; each write is then tried on its own, so the
    good ones are stored and only the bad one's request fails."""
    monkeypatch.setattr(journal_module, "RETRY_DELAYS_S", (0.0,))
    store = Store(sqlite_url(tmp_path))
    await store.migrate()
    journal = Journal(store)
    journal.start()
    try:
        first = journal.record(lambda s: s.add_session("one", "hash"))
        twice = journal.record(lambda s: s.add_session("one", "hash"))  # its key is taken
        last = journal.record(lambda s: s.add_session("two", "hash"))
        await journal.commit(first, last)
        with pytest.raises(StoreError, match="did not take the write"):
            await journal.commit(twice)
        assert sorted(r.session_id for r in await store.sessions()) == ["one", "two"]
        assert journal.failures == 1
    finally:
        await journal.stop()
        await store.close()


@pytest.mark.asyncio(loop_scope="function")
async def test_a_batch_of_calls_is_stored_in_one_commit(served, fake_engine):
    """The calls of one request (a DAG submitted together) are stored together before any
    starts: one commit, not one per call in turn (each call then waited for the one before)."""
    core, store, session = served
    commits = []
    event.listen(store.engine.sync_engine, "commit", lambda _conn: commits.append(1))
    fake_engine.engine.hang = True  # nothing runs meanwhile: no state changes to store
    output = [Binding("a", is_output=True)]
    calls = [CallRequest(f"Part {n}: {{{{a}}}}", output, [], None) for n in range(9)]
    accepted = await core.calls.submit_batch(session, calls)
    assert len(commits) == 1
    stored = {c.call_id for c in (await store.snapshot()).calls}
    assert {call.call_id for call, _ in accepted} <= stored
