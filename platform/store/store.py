"""Reading and writing the ServeCore's records. Alembic brings the schema to head first.

Reads are async queries. Writes are :class:`~parrot.platform.store.writes.StoreWrites`
statements run by :meth:`Store.write`, many in one transaction (see ``writes.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from cryptography.fernet import Fernet
from sqlalchemy import Connection, event, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from parrot.engines.protocol.urls import public_url
from parrot.platform.serve.calls.state import UNFINISHED
from parrot.platform.store.models import (
    CallRecord,
    EngineRecord,
    ServeCoreStateRecord,
    SessionRecord,
    VariableRecord,
)
from parrot.platform.store.secret_box import SecretBox
from parrot.platform.store.writes import StoreWrites

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"

Write = Callable[[StoreWrites], Any]  # one write: statements on a transaction's connection


def sqlite_url(data_dir: Path) -> str:
    """The default database: a SQLite file in the data folder."""
    return f"sqlite+aiosqlite:///{Path(data_dir).resolve() / 'parrot.db'}"


def upgrade_to_head(url: str) -> None:
    """Apply every Alembic migration (synchronous: run it off the event loop)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(config, "head")


class Store:
    """``secrets``: the key engine secrets are encrypted with (``parrot serve`` gives the
    data folder's). None: ``PARROT_SECRET_KEY``, else the key file next to a SQLite
    database (made when absent), else a key of this process only (with a warning)."""

    def __init__(self, url: str, secrets: SecretBox | None = None) -> None:
        if url.startswith("sqlite") and ("///" not in url or url.endswith(":memory:")):
            # Alembic migrates over a connection of its own: an in-memory database would be
            # another, empty one.
            raise ValueError(f"the database must be a file (sqlite+aiosqlite:///path/parrot.db), got {url!r}")
        self.url = url
        self.engine: AsyncEngine = create_async_engine(url)
        if url.startswith("sqlite"):
            # SQLite settings are per connection: foreign keys (session cascades), WAL.
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._box = secrets
        # aiosqlite's DEBUG lines echo every statement with its values: engine API keys and
        # session data must never reach a log, whatever level the operator picks.
        logging.getLogger("aiosqlite").setLevel(max(logging.INFO, logging.getLogger("aiosqlite").level))

    async def migrate(self) -> None:
        if self.url.startswith("sqlite"):
            path = self.url.split("///", 1)[-1]
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(upgrade_to_head, self.url)
        await self._seal_engine_secrets()

    @property
    def secrets(self) -> SecretBox:
        if self._box is None:
            if self.url.startswith("sqlite"):
                folder = Path(self.url.split("///", 1)[-1]).parent
                self._box = SecretBox.from_env(folder)
            elif os.environ.get("PARROT_SECRET_KEY"):
                self._box = SecretBox.from_env(".")
            else:  # a programmatic Store on a server database, without a key given
                log.warning("no secret key given: engine secrets stored now will not survive a restart")
                self._box = SecretBox([Fernet.generate_key()], source="a key of this process only")
        return self._box

    async def close(self) -> None:
        await self.engine.dispose()

    async def write(self, *writes: Write) -> list[Any]:
        """``writes`` in one transaction, in order: all stored, or none if one raises (its
        error is raised here). Their results, in order."""
        async with self.engine.begin() as conn:
            return await conn.run_sync(self._apply, writes)

    def _apply(self, conn: Connection, writes: Sequence[Write]) -> list[Any]:
        statements = StoreWrites(conn, self._split_secrets)
        results = [write(statements) for write in writes]
        statements.flush()
        return results

    # -- sessions ------------------------------------------------------------------------
    async def get_session(self, session_id: str) -> SessionRecord | None:
        async with self._sessions() as db:
            return await db.get(SessionRecord, session_id)

    async def sessions(self) -> Sequence[SessionRecord]:
        async with self._sessions() as db:
            return (await db.scalars(select(SessionRecord).order_by(SessionRecord.created_at))).all()

    # -- semantic variables ---------------------------------------------------------------
    async def get_var(self, var_id: str) -> VariableRecord | None:
        async with self._sessions() as db:
            return await db.get(VariableRecord, var_id)

    async def vars_of(self, session_id: str) -> Sequence[VariableRecord]:
        async with self._sessions() as db:
            query = select(VariableRecord).where(VariableRecord.session_id == session_id)
            return (await db.scalars(query.order_by(VariableRecord.updated_at))).all()

    async def global_var(self, content_hash: str) -> VariableRecord | None:
        async with self._sessions() as db:
            query = select(VariableRecord).where(VariableRecord.content_hash == content_hash)
            return (await db.scalars(query)).first()

    # -- semantic calls -------------------------------------------------------------------
    async def get_call(self, call_id: str) -> CallRecord | None:
        async with self._sessions() as db:
            return await db.get(CallRecord, call_id)

    async def calls_of(self, session_id: str) -> Sequence[CallRecord]:
        async with self._sessions() as db:
            query = select(CallRecord).where(CallRecord.session_id == session_id).order_by(CallRecord.seq)
            return (await db.scalars(query)).all()

    async def unfinished_calls(self) -> Sequence[CallRecord]:
        """Calls to re-queue after a restart, in submission order."""
        async with self._sessions() as db:
            query = select(CallRecord).where(CallRecord.state.in_(UNFINISHED)).order_by(CallRecord.seq)
            return (await db.scalars(query)).all()

    async def snapshot(self) -> Snapshot:
        async with self._sessions() as db:
            return Snapshot(
                sessions=(await db.scalars(select(SessionRecord).order_by(SessionRecord.created_at))).all(),
                vars=(
                    await db.scalars(
                        select(VariableRecord)
                        .where(VariableRecord.session_id.is_not(None))
                        .order_by(VariableRecord.updated_at)
                    )
                ).all(),
                calls=(await db.scalars(select(CallRecord).order_by(CallRecord.seq))).all(),
                engines=(await db.scalars(select(EngineRecord).order_by(EngineRecord.created_at))).all(),
            )

    # -- engines --------------------------------------------------------------------------
    def _split_secrets(self, url: str, secrets: dict[str, str]) -> tuple[str, str | None]:
        shown = public_url(url)
        if shown != url.rstrip("/"):  # credentials or a query: the whole URL is a secret
            secrets["url"] = url
        secrets = {name: value for name, value in secrets.items() if value}
        return shown, self.secrets.seal(secrets) if secrets else None

    def engine_secrets(self, record: EngineRecord) -> dict[str, str]:
        """The decrypted secrets of an engine record: ``api_key``, ``url`` (the URL with its
        credentials), each when it has one. Raises SecretKeyError with the wrong key."""
        return self.secrets.open(record.secret) if record.secret else {}

    async def _seal_engine_secrets(self) -> None:
        """Encrypt what an older version stored in the clear (an API key in ``secret``,
        credentials inside ``url``), and re-encrypt secrets sealed with an older key, once,
        on start. Secrets that do not decrypt are left as they are (and reported at restore)."""
        box, changed = self.secrets, 0
        async with self._sessions.begin() as db:
            for record in (await db.scalars(select(EngineRecord))).all():
                clear_url = public_url(record.url) == record.url.rstrip("/")
                if not record.secret and clear_url:
                    continue
                if record.secret and box.is_sealed(record.secret):
                    if clear_url and not box.needs_rotation(record.secret):
                        continue
                    try:
                        secrets = box.open(record.secret)
                    except ValueError as error:
                        log.error("engine %s: %s", record.engine_id, error)
                        continue
                else:  # plaintext of an older version: the API key
                    secrets = {"api_key": record.secret} if record.secret else {}
                secrets.setdefault("url", record.url)
                record.url, record.secret = self._split_secrets(secrets.pop("url"), secrets)
                changed += 1
        if changed:
            log.info("encrypted the secrets of %d stored engine(s) with the key from %s", changed, box.source)
            await self._scrub()

    async def _scrub(self) -> None:
        """Leave no old plaintext in the SQLite file's free pages or its write-ahead log."""
        if not self.url.startswith("sqlite"):
            return
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM")
            await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    async def engines(self) -> Sequence[EngineRecord]:
        async with self._sessions() as db:
            return (await db.scalars(select(EngineRecord).order_by(EngineRecord.created_at))).all()

    # -- the ServeCore's own state ------------------------------------------------------
    async def get_state(self, name: str) -> dict | None:
        async with self._sessions() as db:
            record = await db.get(ServeCoreStateRecord, name)
            return None if record is None else record.value


@dataclass(frozen=True)
class Snapshot:
    """Everything a restarting ServeCore reads back, in creation order."""

    sessions: Sequence[SessionRecord]
    vars: Sequence[VariableRecord]
    calls: Sequence[CallRecord]
    engines: Sequence[EngineRecord]


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    # WAL with synchronous=NORMAL survives a killed process (not a power cut) at a fraction
    # of the fsyncs of the default journal; every variable and call state is one write.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
