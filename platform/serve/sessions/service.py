"""Sessions: made, opened with their ``session_auth``, kept alive, expired and deleted.

A session owns its variables and its calls; deleting or expiring
it stops its work and frees all of them (its contexts on the engines included). Its
``session_auth`` is kept only as a hash. The last few closed sessions are kept as they
were when they closed, for the dashboard.

What a client is told exists is stored first: ``create`` returns only after the session's
record is in the database, and undoes the session if the database does not take it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections import deque
from collections.abc import Iterator, Sequence

from parrot.engines.protocol.errors import NotFoundError, ParrotError
from parrot.platform.serve.calls.drive import CallDriver
from parrot.platform.serve.errors import ForbiddenError, UnauthorizedError
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.limits.admission import Admission
from parrot.platform.serve.ops import observe
from parrot.platform.serve.ops.observe import SessionDag, SessionSummary
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.sessions.session import Session
from parrot.platform.serve.variables.values import VariableValues
from parrot.platform.store.models import SessionRecord

log = logging.getLogger(__name__)
TOUCH_EVERY_S = 30.0  # how stale a session's stored last-activity time may get
RECENT_SESSIONS = 20  # closed sessions whose DAG the dashboard still shows


def hash_auth(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class SessionService:
    """The live sessions (``session_id in sessions``, ``len(sessions)``, iteration: ids)."""

    def __init__(
        self,
        journal: Journal,
        admission: Admission,
        scheduler: GlobalScheduler,
        values: VariableValues,
        driver: CallDriver,
        timeout_s: float,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("session_timeout_s must be positive")
        self.timeout_s = timeout_s
        self.journal = journal
        self.admission = admission
        self.scheduler = scheduler
        self.values = values
        self.driver = driver
        self._live: dict[str, Session] = {}
        # Closed sessions, newest last, as they were when they closed (for the dashboard).
        self.recent: deque[tuple[SessionSummary, SessionDag]] = deque(maxlen=RECENT_SESSIONS)
        self._expiry: asyncio.Task | None = None

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._live

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._live))

    def __len__(self) -> int:
        return len(self._live)

    def get(self, session_id: str) -> Session | None:
        """A live session, without an auth check (the caller checks who may see it)."""
        return self._live.get(session_id)

    def live(self) -> list[Session]:
        return list(self._live.values())

    async def create(
        self,
        stored: bool = True,
        client: str | None = None,
        wait: bool = True,
        label: str | None = None,
        tags: Sequence[str] = (),
    ) -> tuple[Session, str]:
        """A new session and its ``session_auth``; ``client`` (its address) counts it
        towards that client's limit. ``wait=False``: its record's write is left to the
        calls submitted next (``Session.unconfirmed``), whose commit it joins. ``label``
        and ``tags`` (checked at the edge) are stored with it, a repeated tag once."""
        for index, text in enumerate(tags):  # stored: text every store keeps (no NUL)
            self.admission.check_text(text, f"tags[{index}]")
        self.admission.check_text(label, "the label")
        session_id = secrets.token_hex(8)
        auth = secrets.token_urlsafe(24)
        self.admission.open_session(session_id, client)
        session = self._add(session_id, hash_auth(auth), label, tuple(dict.fromkeys(tags)))
        session.stored = stored
        if stored:
            label, tags = session.label, session.tags
            write = self.journal.record(
                lambda db: db.add_session(session_id, session.auth_hash, label, tags)
            )
            if not wait:
                session.unconfirmed = write
                return session, auth
            try:
                await self.journal.commit(write)
            except ParrotError:
                self._live.pop(session_id, None)
                self.admission.close_session(session_id)
                raise
        return session, auth

    def _add(
        self, session_id: str, auth_hash: str, label: str | None = None, tags: tuple[str, ...] = ()
    ) -> Session:
        session = Session(session_id, auth_hash, label=label, tags=tags)
        self._live[session_id] = session
        return session

    def open(self, session_id: str, auth: str | None) -> Session:
        """The session, for the holder of its ``session_auth`` (raises 401 / 403 / 404)."""
        if not auth:
            raise UnauthorizedError("missing 'Authorization: Bearer <session_auth>' header")
        session = self._live.get(session_id)
        if session is None:
            raise NotFoundError(f"session {session_id!r} does not exist")
        if not hmac.compare_digest(session.auth_hash.encode(), hash_auth(auth).encode()):
            raise ForbiddenError(f"the session_auth does not belong to session {session_id!r}")
        session.last_active = time.monotonic()
        if session.stored and session.last_active - session.stored_active > TOUCH_EVERY_S:
            session.stored_active = session.last_active
            self.journal.record(lambda db: db.touch_session(session_id))
        return session

    async def delete(self, session: Session, batch_frees: bool = False) -> None:
        """Delete the session's records, then stop its work (queued tasks dropped, running
        generations aborted on their engines), free its contexts and wake whoever waits on
        its variables. The store goes first: a delete it refuses (:class:`StoreError`, 503)
        changes nothing, and the session goes on as before. ``batch_frees``: no one waits
        for its contexts' frees (a one-shot session closed after its answer)."""
        if session.closed:
            return
        session.closed = True  # no new work while the store deletes
        if session.stored:
            sid = session.session_id  # the write holds the id, not the session and its values
            try:
                await self.journal.commit(self.journal.record(lambda db: db.delete_session(sid)))
            except BaseException:
                session.closed = False
                raise
        self._live.pop(session.session_id, None)
        self.admission.close_session(session.session_id, list(session.calls), list(session.vars))
        if session.stored:
            sid, calls = session.session_id, session.calls.values()
            self.recent.append(
                (
                    observe.summarize(session, live=False, closed_at=time.time()),
                    observe.session_dag(
                        sid, calls, session.vars.values(), live=False, named=(session.label, session.tags)
                    ),
                )
            )
        self.driver.stop(session)
        await self.scheduler.drop_session(session.session_id, batch_frees)
        self.values.close(session.vars.values(), f"session {session.session_id} was deleted")

    async def expire_idle(self) -> list[str]:
        """Delete sessions idle for longer than the timeout, freeing everything they hold."""
        deadline = time.monotonic() - self.timeout_s
        idle = [s for s in self._live.values() if s.last_active < deadline]
        for session in idle:
            await self.delete(session)
        return [s.session_id for s in idle]

    def restore(self, records: Sequence[SessionRecord]) -> None:
        """Sessions from the store, idle for as long as they were before the restart."""
        now_wall, now = time.time(), time.monotonic()
        for record in records:
            session = self._add(record.session_id, record.auth_hash, record.label, tuple(record.tags or ()))
            self.admission.open_session(record.session_id, None)  # its values count server-wide
            idle = now_wall - record.last_active_at.timestamp()
            session.last_active = now - max(0.0, idle)

    def start(self) -> None:
        self._expiry = asyncio.create_task(self._expire_loop())

    def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(60.0, self.timeout_s / 2))
            try:
                await self.expire_idle()
            except ParrotError as error:  # the store: the next round tries again
                log.warning("expiring idle sessions failed: %s", error)
            except Exception:  # a bug: logged, and expiry goes on
                log.exception("expiring idle sessions failed")
