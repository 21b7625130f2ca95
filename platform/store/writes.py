"""The store's writes: plain SQL statements on the connection of one transaction.

Every write of the ServeCore is one of these methods, run by :meth:`Store.write` inside a
transaction, many in one (the journal's group commit). Rows go in as rows, not as mapped
objects (an object costs its instance state and the unit of work's flush), the new rows of
a batch in one statement a table, and an update's statement is built once per shape: a
batch of 16 applications' sessions, calls and variables and then their calls' states took
120.6 ms as mapped objects, 50.8 ms now (``benchmarks/store_writes.py``). Tried and
dropped: a batch in one hop to a writer thread of its own (5.0 ms; but its Python held the
GIL the event loop waited for: ``/healthz`` under 3,000 calls on a loaded host answered at
a p99 of 0.3-0.5 s, against 0.3 s allowed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, CursorResult, Executable, Table, Update, bindparam, delete, insert, update

from parrot.platform.store.models import (
    CallRecord,
    EngineRecord,
    ServeCoreStateRecord,
    SessionRecord,
    VariableRecord,
    now,
)

SESSIONS: Table = SessionRecord.__table__  # type: ignore[assignment]
VARS: Table = VariableRecord.__table__  # type: ignore[assignment]
CALLS: Table = CallRecord.__table__  # type: ignore[assignment]
ENGINES: Table = EngineRecord.__table__  # type: ignore[assignment]
STATE: Table = ServeCoreStateRecord.__table__  # type: ignore[assignment]
INSERT_ORDER = (SESSIONS, VARS, CALLS)  # a row's foreign keys name rows of the tables before


@functools.cache
def _update_statement(table: Table, key: str, fields: tuple[str, ...]) -> Update:
    """``UPDATE table SET fields WHERE key``, with its values bound at execution. Built once
    per shape: building the statement was 0.2 of the 0.28 ms a state change cost."""
    new = {name: bindparam(f"new_{name}") for name in fields}
    return update(table).where(table.c[key] == bindparam("key")).values(new)


Row = Mapping[str, Any]  # a row to insert, by column
# (url, secrets) -> (the URL shown, the sealed secrets or None): the store's key seals them.
SealSecrets = Callable[[str, dict[str, str]], tuple[str, "str | None"]]


class StoreWrites:
    """The writes on ``conn``, a connection inside a transaction. Row dicts come from
    :func:`~parrot.platform.store.models.var_record` and :func:`call_record`."""

    def __init__(self, conn: Connection, seal_secrets: SealSecrets) -> None:
        self._conn = conn
        self._seal = seal_secrets
        # New rows wait here, by table, and go in one statement a table (see flush).
        self._new: dict[Table, list[Row]] = {table: [] for table in INSERT_ORDER}

    def flush(self) -> None:
        """Insert the rows added so far: a table's rows in one statement, the tables in the
        order their foreign keys need (a session before its variables and calls). Every
        other statement flushes first, so it sees them. Through aiosqlite each statement
        is a hop to its thread: 13 applications submitted together wrote 39 statements
        (20 ms, their calls waiting for it), now 3."""
        for table, rows in self._new.items():
            if rows:
                self._new[table] = []
                self._conn.execute(insert(table), rows)

    def _execute(self, statement: Executable, params: Any = None) -> CursorResult:
        self.flush()
        return self._conn.execute(statement, params)

    def _update(self, table: Table, key: str, key_value: str, **fields: Any) -> bool:
        statement = _update_statement(table, key, tuple(sorted(fields)))
        values = {f"new_{name}": value for name, value in fields.items()}
        return self._execute(statement, {"key": key_value, **values}).rowcount > 0

    # -- sessions ------------------------------------------------------------------------
    def add_session(
        self, session_id: str, auth_hash: str, label: str | None = None, tags: Sequence[str] = ()
    ) -> None:
        stamp = now()
        row = dict(
            session_id=session_id,
            auth_hash=auth_hash,
            created_at=stamp,
            last_active_at=stamp,
            label=label,
            tags=list(tags) or None,
        )
        self._new[SESSIONS].append(row)

    def touch_session(self, session_id: str) -> bool:
        return self._update(SESSIONS, "session_id", session_id, last_active_at=now())

    def delete_session(self, session_id: str) -> bool:
        """Deletes the session with its variables and calls (the foreign keys cascade)."""
        return self._execute(delete(SESSIONS).where(SESSIONS.c.session_id == session_id)).rowcount > 0

    # -- semantic variables ---------------------------------------------------------------
    def add_vars(self, rows: Sequence[Row]) -> None:
        self._new[VARS] += rows

    def set_var_value(self, var_id: str, value: str) -> bool:
        return self._update(VARS, "var_id", var_id, value=value, error=None, updated_at=now())

    def set_var_format(self, var_id: str, format: dict | None) -> bool:
        """Type an existing variable (it became the output of a call with a format)."""
        return self._update(VARS, "var_id", var_id, format=format, updated_at=now())

    def set_var_error(self, var_id: str, error: str) -> bool:
        return self._update(VARS, "var_id", var_id, error=error, updated_at=now())

    # -- semantic calls -------------------------------------------------------------------
    def add_calls(self, calls: Sequence[Row], new_vars: Sequence[Row] = ()) -> None:
        """Calls and the variables they made."""
        self.add_vars(new_vars)
        self._new[CALLS] += calls

    def update_call(self, call_id: str, **fields: Any) -> bool:
        return self._update(CALLS, "call_id", call_id, **fields)

    # -- engines --------------------------------------------------------------------------
    def save_engine(
        self,
        engine_id: str,
        kind: str,
        url: str,
        model: str,
        config: dict | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        """``url`` is stored without credentials or query; those, and ``secrets`` (an API
        key), are stored encrypted (:meth:`Store.engine_secrets` gives them back)."""
        shown, sealed = self._seal(url, dict(secrets or {}))
        fields = dict(kind=kind, url=shown, model=model, config=config or {}, secret=sealed, status="up")
        if not self._update(ENGINES, "engine_id", engine_id, **fields):
            self._execute(insert(ENGINES), [dict(engine_id=engine_id, created_at=now(), **fields)])

    def set_engine_status(self, engine_id: str, status: str) -> bool:
        return self._update(ENGINES, "engine_id", engine_id, status=status)

    def delete_engine(self, engine_id: str) -> bool:
        return self._execute(delete(ENGINES).where(ENGINES.c.engine_id == engine_id)).rowcount > 0

    # -- the ServeCore's own state ------------------------------------------------------
    def set_state(self, name: str, value: dict) -> None:
        if not self._update(STATE, "name", name, value=value):
            self._execute(insert(STATE), [dict(name=name, value=value)])
