"""Tables of the ServeCore. The schema itself is owned by Alembic (``migrations/``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from parrot.platform.serve.calls.state import CallState


class Base(DeclarativeBase):
    pass


class EngineRecord(Base):
    __tablename__ = "engines"

    engine_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # builtin | openai
    url: Mapped[str] = mapped_column(String(2048))
    model: Mapped[str] = mapped_column(String(256))
    config: Mapped[dict] = mapped_column(JSON, default=dict)  # capacity, api mode, ...
    secret: Mapped[str | None] = mapped_column(Text, nullable=True)  # never returned by the API
    status: Mapped[str] = mapped_column(String(32), default="up")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SessionRecord(Base):
    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    auth_hash: Mapped[str] = mapped_column(String(128))  # sha256 of the session_auth secret
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_active_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # What its client named it, to find it by (None / NULL: sessions made without one).
    label: Mapped[str | None] = mapped_column(String(200), nullable=True)
    tags: Mapped[list | None] = mapped_column(JSON, nullable=True)


class VariableRecord(Base):
    __tablename__ = "semantic_vars"

    var_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # None for global, content-addressed variables (constant prompt prefixes).
    session_id: Mapped[str | None] = mapped_column(
        ForeignKey("sessions.session_id", ondelete="CASCADE"), nullable=True, index=True
    )
    name: Mapped[str] = mapped_column(String(256))
    value: Mapped[str | None] = mapped_column(Text, nullable=True)
    content_hash: Mapped[str | None] = mapped_column(String(128), nullable=True, unique=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # why its producer failed
    # A typed variable's format (the JSON of parrot.wire.formats.OutputFormat); None: untyped.
    format: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class CallRecord(Base):
    __tablename__ = "semantic_calls"

    call_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id", ondelete="CASCADE"), index=True)
    seq: Mapped[int] = mapped_column(Integer)  # submission order within the ServeCore
    template: Mapped[str] = mapped_column(Text)
    parameters: Mapped[list] = mapped_column(JSON)
    models: Mapped[list] = mapped_column(JSON, default=list)
    output_criteria: Mapped[str | None] = mapped_column(String(32), nullable=True)
    state: Mapped[str] = mapped_column(String(32), index=True)  # pending | running | done | failed
    engine_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    timings: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ServeCoreStateRecord(Base):
    """Small facts the ServeCore keeps about its own runs (by name), e.g. the context-id
    regions its earlier runs used on engines (``platform/serve/contexts/orphans.py``)."""

    __tablename__ = "servecore_state"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict] = mapped_column(JSON)


def now() -> datetime:
    return datetime.now(UTC)


def var_record(
    var_id: str,
    session_id: str | None,
    name: str,
    value: str | None = None,
    content_hash: str | None = None,
    format: dict | None = None,
) -> dict[str, Any]:
    """A variable's row, to add (``format``: a typed variable's format, as JSON). A plain
    row, not a mapped object: the store inserts it as it is (an object costs its state)."""
    return dict(
        var_id=var_id,
        session_id=session_id,
        name=name,
        value=value,
        content_hash=content_hash,
        format=format,
        error=None,
        updated_at=now(),
    )


def call_record(
    call_id: str,
    session_id: str,
    seq: int,
    template: str,
    parameters: list[dict],
    models: list[str] | None = None,
    output_criteria: str | None = None,
    timings: dict | None = None,
) -> dict[str, Any]:
    """A new call's row, to add (pending)."""
    return dict(
        call_id=call_id,
        session_id=session_id,
        seq=seq,
        template=template,
        parameters=parameters,
        models=models or [],
        output_criteria=output_criteria,
        state=CallState.PENDING,
        engine_id=None,
        error=None,
        timings=timings or {},
        created_at=now(),
    )
