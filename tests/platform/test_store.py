"""The SQL store on a real SQLite file and on a real PostgreSQL server (the PostgreSQL tier):
migrations, records, cascades, survival of a restart."""

from __future__ import annotations

import pytest
import pytest_asyncio
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from parrot.platform.store.models import call_record, var_record
from parrot.platform.store.store import Store

pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest_asyncio.fixture(loop_scope="function")
async def store(db_url):
    s = Store(db_url)
    await s.migrate()
    yield s
    await s.close()


async def test_migrations_create_the_schema_and_are_idempotent(store):
    await store.migrate()  # a second start applies nothing new
    async with store.engine.connect() as db:
        tables = set(await db.run_sync(lambda sync: inspect(sync).get_table_names()))
        version = (await db.execute(text("select version_num from alembic_version"))).all()
    assert {"engines", "sessions", "semantic_vars", "semantic_calls", "alembic_version"} <= tables
    assert "servecore_state" in tables
    assert version == [("0004",)]  # 0004: session labels (issue 38)


async def test_records_survive_a_restart(store):
    await store.write(lambda db: db.add_session("s1", "hash"))
    await store.write(lambda db: db.add_vars([var_record("v1", "s1", "question", "What is a tide?")]))
    await store.write(lambda db: db.add_vars([var_record("v2", "s1", "answer")]))
    params = [{"name": "question", "var_id": "v1"}, {"name": "answer", "is_output": True}]
    await store.write(
        lambda db: db.add_calls([call_record("c1", "s1", 1, "Q: {{question}} A: {{answer}}", params)])
    )
    await store.write(lambda db: db.add_calls([call_record("c2", "s1", 2, "done: {{answer}} {{x}}", [])]))
    await store.write(lambda db: db.update_call("c2", state="done", engine_id="e1", timings={"total_s": 1.5}))
    await store.write(lambda db: db.set_var_value("v2", "Water rising."))
    await store.write(
        lambda db: db.save_engine(
            "e1", "builtin", "http://127.0.0.1:9001", "smol", {"capacity": 8}, secrets={"api_key": "sk-1"}
        )
    )
    await store.close()

    reopened = Store(store.url, secrets=store.secrets)  # the same server key
    await reopened.migrate()
    try:
        assert (await reopened.get_session("s1")).auth_hash == "hash"
        assert [(v.name, v.value) for v in await reopened.vars_of("s1")] == [
            ("question", "What is a tide?"),
            ("answer", "Water rising."),
        ]
        assert [c.call_id for c in await reopened.unfinished_calls()] == ["c1"]
        done = await reopened.get_call("c2")
        assert done.state == "done" and done.timings == {"total_s": 1.5} and done.engine_id == "e1"
        (engine,) = await reopened.engines()
        assert engine.config == {"capacity": 8} and "sk-1" not in engine.secret  # encrypted
        assert reopened.engine_secrets(engine) == {"api_key": "sk-1"}
    finally:
        await reopened.close()


async def test_deleting_a_session_deletes_its_vars_and_calls(store):
    await store.write(lambda db: db.add_session("s1", "h"))
    await store.write(lambda db: db.add_session("s2", "h"))
    await store.write(lambda db: db.add_vars([var_record("v1", "s1", "a", "1")]))
    await store.write(lambda db: db.add_vars([var_record("v2", "s2", "b", "2")]))
    await store.write(lambda db: db.add_calls([call_record("c1", "s1", 1, "t", [])]))
    assert (await store.write(lambda db: db.delete_session("s1")))[0]
    assert await store.get_var("v1") is None and await store.get_call("c1") is None
    assert (await store.get_var("v2")).value == "2"
    assert not (await store.write(lambda db: db.delete_session("s1")))[0]


async def test_global_variables_are_found_by_content(store):
    await store.write(
        lambda db: db.add_vars([var_record("g1", None, "system", "You are helpful.", content_hash="abc")])
    )
    assert (await store.global_var("abc")).var_id == "g1"
    assert await store.global_var("nope") is None
    with pytest.raises(IntegrityError):
        await store.write(
            lambda db: db.add_vars([var_record("g2", None, "system", "You are helpful.", content_hash="abc")])
        )


async def test_engine_records_update_and_delete(store):
    await store.write(lambda db: db.save_engine("e1", "builtin", "http://a", "m"))
    await store.write(lambda db: db.save_engine("e1", "builtin", "http://b", "m", {"capacity": 2}))
    assert [(e.url, e.config) for e in await store.engines()] == [("http://b", {"capacity": 2})]
    assert (await store.write(lambda db: db.set_engine_status("e1", "down")))[0]
    assert (await store.engines())[0].status == "down"
    assert (await store.write(lambda db: db.delete_engine("e1")))[0] and not await store.engines()


async def test_models_and_migrations_agree(store):
    """Alembic's autogenerate finds nothing to change: models.py and migrations/ are in step."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from parrot.platform.store.models import Base

    def diff(connection):
        context = MigrationContext.configure(connection, opts={"render_as_batch": True})
        return compare_metadata(context, Base.metadata)

    async with store.engine.connect() as connection:
        assert await connection.run_sync(diff) == []


async def test_a_typed_variable_keeps_its_format_across_a_restart(store):
    """Issue 21: the format is stored with the variable (migration 0003), set when it is
    made or later (an output of a call that has one), and read back as it was."""
    schema = {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"}}}}
    await store.write(lambda db: db.add_session("s1", "hash"))
    await store.write(
        lambda db: db.add_vars([var_record("v1", "s1", "plan", None, format={"json_schema": schema})])
    )
    await store.write(lambda db: db.add_vars([var_record("v2", "s1", "verdict")]))
    await store.write(lambda db: db.add_vars([var_record("v3", "s1", "free", "text")]))
    assert (await store.write(lambda db: db.set_var_format("v2", {"choice": ["yes", "no"]})))[0]
    await store.write(lambda db: db.set_var_value("v1", '{"steps":["a"]}'))
    await store.close()

    reopened = Store(store.url, secrets=store.secrets)
    await reopened.migrate()
    try:
        got = {v.name: (v.format, v.value) for v in await reopened.vars_of("s1")}
        assert got == {
            "plan": ({"json_schema": schema}, '{"steps":["a"]}'),
            "verdict": ({"choice": ["yes", "no"]}, None),
            "free": (None, "text"),
        }
    finally:
        await reopened.close()


async def test_a_session_keeps_its_label_and_tags_across_a_restart(store):
    """Issue 38: a session's label and tags are stored with it (migration 0004); one made
    without them has NULL in both."""
    await store.write(lambda db: db.add_session("s1", "hash", "Harbour «log»", ["fog", "night"]))
    await store.write(lambda db: db.add_session("s2", "hash"))
    await store.close()

    reopened = Store(store.url, secrets=store.secrets)
    await reopened.migrate()
    try:
        got = {s.session_id: (s.label, s.tags) for s in await reopened.sessions()}
        assert got == {"s1": ("Harbour «log»", ["fog", "night"]), "s2": (None, None)}
    finally:
        await reopened.close()


async def test_writes_given_together_are_one_transaction(store):
    """``Store.write``: all of them stored, in order, or none when one fails (its error
    raised); the results come back in order."""
    results = await store.write(
        lambda db: db.add_session("s1", "h"),
        lambda db: db.add_vars([var_record("v1", "s1", "a")]),
        lambda db: db.set_var_value("v1", "1"),  # sees the row written just before
        lambda db: db.set_var_value("nope", "1"),
    )
    assert results == [None, None, True, False]
    with pytest.raises(IntegrityError):
        await store.write(
            lambda db: db.add_session("s2", "h"),
            lambda db: db.set_var_value("v1", "2"),
            lambda db: db.add_session("s1", "h"),  # its key is taken: the whole batch is undone
        )
    assert await store.get_session("s2") is None
    assert (await store.get_var("v1")).value == "1"
    assert await store.write() == []


async def test_the_new_rows_of_a_batch_go_in_one_statement_a_table(store):
    """Applications submitted together: their sessions, variables and calls are three
    statements (each a hop to the database's thread on SQLite), in the order their foreign
    keys need; a statement of another kind sees the rows added before it."""
    from sqlalchemy import event

    statements: list[str] = []
    listener = lambda *args: statements.append(args[2].split()[0])  # noqa: E731  (conn, cursor, statement, ...)
    event.listen(store.engine.sync_engine, "before_cursor_execute", listener)
    writes = []
    for app in range(5):
        sid = f"s{app}"
        calls = [call_record(f"c{app}-{n}", sid, n, "t", []) for n in range(3)]
        writes += [
            lambda db, sid=sid: db.add_session(sid, "h"),
            lambda db, c=calls, sid=sid: db.add_calls(c, [var_record(f"v{sid}", sid, "a")]),
        ]
    await store.write(*writes)
    assert statements == ["INSERT", "INSERT", "INSERT"]
    statements.clear()
    results = await store.write(
        lambda db: db.add_session("late", "h"),
        lambda db: db.add_vars([var_record("v-late", "late", "a")]),
        lambda db: db.set_var_value("v-late", "seen"),  # flushes the two rows first
    )
    event.remove(store.engine.sync_engine, "before_cursor_execute", listener)
    assert results[-1] is True and statements == ["INSERT", "INSERT", "UPDATE"]
    assert len((await store.snapshot()).calls) == 15
