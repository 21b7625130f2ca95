"""Semantic variables of sessions: created, set by clients, read (waiting for their value).

A variable joins its session here and its record is written here; values produced by calls
arrive through the call driver (:mod:`parrot.platform.serve.calls.drive`). A latency-critical
get *activates* the variable's producers, backwards through the session's DAG, so the
scheduler runs them first.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from parrot.engines.protocol.errors import BadRequestError, NotFoundError, ParrotError
from parrot.platform.serve.calls.drive import CallDriver
from parrot.platform.serve.errors import (
    FormatMismatchError,
    ProducerFailedError,
    SessionClosedError,
    WaitTimeoutError,
)
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.limits.admission import Admission
from parrot.platform.serve.ops.metrics import ServeMetrics
from parrot.platform.serve.scheduler.task import LATENCY, THROUGHPUT
from parrot.platform.serve.sessions.service import SessionService
from parrot.platform.serve.sessions.session import Session
from parrot.platform.serve.variables.formats import FormatProbe, check_format, mismatch
from parrot.platform.serve.variables.values import VariableValues
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.platform.store.models import VariableRecord, var_record
from parrot.wire.formats import OutputFormat

CRITERIA = (LATENCY, THROUGHPUT)


def new_id(kind: str) -> str:
    """A fresh id of a variable or a call (``var-…``, ``call-…``)."""
    return f"{kind}-{secrets.token_hex(8)}"


def check_criteria(criteria: str | None, what: str) -> None:
    if criteria is not None and criteria not in CRITERIA:
        raise BadRequestError(f"{what} must be one of {CRITERIA}, got {criteria!r}")


class VariableService:
    def __init__(
        self,
        journal: Journal,
        admission: Admission,
        values: VariableValues,
        driver: CallDriver,
        metrics: ServeMetrics,
    ) -> None:
        self.metrics = metrics  # seconds each get waited
        self.journal = journal
        self.admission = admission
        self.values = values
        self.driver = driver  # a latency get prioritizes the producers through it
        self.probe = FormatProbe(admission.limits.max_format_probe_ms / 1000)

    def add(self, session: Session, var: SemanticVariable) -> dict[str, Any] | None:
        """Add ``var`` to its session; its row, for the caller to store with what made it
        (None: not stored)."""
        var.stored = session.stored
        session.vars[var.var_id] = var
        self.admission.budget.join(session.session_id, var.var_id)
        if not var.stored:
            return None
        fmt = None if var.format is None else msgspec.to_builtins(var.format)
        return var_record(var.var_id, session.session_id, var.name, var.value, format=fmt)

    def retype(self, var: SemanticVariable, fmt: OutputFormat) -> asyncio.Future | None:
        """Give an existing, untyped variable a format (it became the output of a call that
        has one); the future of its record's write (None: not stored)."""
        var.format = fmt
        if not var.stored:
            return None
        builtins = msgspec.to_builtins(fmt)
        return self.journal.record(lambda db: db.set_var_format(var.var_id, builtins))

    @staticmethod
    def untype(var: SemanticVariable) -> None:
        """Undo :meth:`retype` (the call that typed it was not stored: it never existed)."""
        var.format = None

    def check_format(self, fmt: OutputFormat) -> None:
        """400 / 413 for a format the ServeCore cannot use (``max_format_chars``)."""
        check_format(fmt, self.admission.limits.max_format_chars)

    async def check_formats(self, formats: Sequence[OutputFormat | None]) -> None:
        """:meth:`check_format` of each format, then its compilation and first token off
        the event loop (a 400 for a format no text can start or one too costly to prepare)."""
        for fmt in formats:
            if fmt is not None and not self.probe.passed(fmt):  # (a format a call repeats: once)
                self.check_format(fmt)
                await self.probe.check(fmt)

    async def create(
        self, session: Session, name: str, value: str | None = None, fmt: OutputFormat | None = None
    ) -> SemanticVariable:
        """A variable of the session, with its value or without; typed when ``fmt`` is given
        (its value, now or later, must match it)."""
        self.admission.check_text(name, "the variable name")
        self.admission.check_value(value, f"the value of variable {name!r}")
        if fmt is not None:
            await self.check_formats([fmt])
            await self._check_value(fmt, name, value)
        self.admission.check_session_growth(session.session_id, len(session.vars), 1, len(session.calls), 0)
        var = SemanticVariable(new_id("var"), name, value, format=fmt)
        self.admission.budget.take(session.session_id, [(var.var_id, value)])  # 429 / 507
        record = self.add(session, var)
        try:
            if record is not None:
                await self.journal.commit(self.journal.record(lambda db: db.add_vars([record])))
        except ParrotError:
            self.forget(session, [var])
            raise
        return var

    def forget(self, session: Session, variables: Sequence[SemanticVariable]) -> None:
        """Undo :meth:`add` (their store write failed: they never existed)."""
        for var in variables:
            session.vars.pop(var.var_id, None)
        self.admission.budget.give_back(v.var_id for v in variables)

    def find(self, session: Session, var_id: str) -> SemanticVariable:
        var = session.vars.get(var_id)
        if var is None:
            raise NotFoundError(f"variable {var_id!r} does not exist in session {session.session_id!r}")
        return var

    async def set(self, session: Session, var_id: str, value: str) -> SemanticVariable:
        var = self.find(session, var_id)
        self.admission.check_value(value, f"the value of variable {var_id!r}")
        if var.producer is not None:
            raise BadRequestError(f"variable {var_id!r} is the output of call {var.producer.call.call_id}")
        if var.ready:
            raise BadRequestError(f"variable {var_id!r} already has a value")
        await self._check_value(var.format, var.name, value)
        charged = self.admission.budget.take(session.session_id, [(var_id, value)])  # 429 / 507
        try:
            if var.stored:  # stored first: consumers start the moment the value is set
                await self.journal.commit(
                    self.journal.record(lambda db: db.set_var_value(var_id, value))
                )
        except BaseException:
            self.admission.budget.uncharge(charged)
            raise
        if var.ready:  # set by a concurrent request meanwhile
            raise BadRequestError(f"variable {var_id!r} already has a value")
        self.values.set_value(var, value, checked=True)
        return var

    @staticmethod
    async def _check_value(fmt: OutputFormat | None, name: str, value: str | None) -> None:
        """Once, in a worker thread: a schema may take seconds on a hostile value (a regex
        or grammar is matched in time linear in the value: ``grammar.text_mismatch``)."""
        why = None if fmt is None or value is None else await asyncio.to_thread(mismatch, fmt, value)
        if why is not None:
            raise FormatMismatchError(
                f"the value of variable {name!r} does not match its {fmt.kind} format: {why}"
            )

    async def get(self, session: Session, var_id: str, criteria: str, timeout: float) -> SemanticVariable:
        """The variable once it has its value (a ``latency`` get runs its producers first);
        408 when ``timeout`` passes first, 424 with the reason when it will never come."""
        var = self.find(session, var_id)
        check_criteria(criteria, "criteria")
        if criteria == LATENCY:
            self.driver.prioritize(session, [var])
        started = time.monotonic()
        try:
            if not var.settled.is_set():
                if timeout <= 0:
                    raise TimeoutError
                await asyncio.wait_for(var.settled.wait(), timeout)
        except TimeoutError:
            raise WaitTimeoutError(f"variable {var_id!r} has no value after {timeout}s") from None
        finally:
            self.metrics.observe_wait(time.monotonic() - started)
        if var.error is None:
            return var
        if session.closed:
            raise SessionClosedError(f"session {session.session_id!r} was deleted while waiting")
        raise ProducerFailedError(f"variable {var.name!r} has no value: {var.error}")

    async def wait_value(self, var: SemanticVariable) -> str:
        """The value of a variable of a live session (raises the producer's failure)."""
        await var.settled.wait()
        if var.error is not None:
            raise ProducerFailedError(f"variable {var.name!r} has no value: {var.error}")
        return var.value or ""

    def restore(self, records: Sequence[VariableRecord], sessions: SessionService) -> None:
        """Variables from the store, with the values and errors they had (their values
        counted again)."""
        for record in records:
            session = sessions.get(record.session_id or "")
            if session is not None:
                fmt = None if record.format is None else msgspec.convert(record.format, OutputFormat)
                var = SemanticVariable(record.var_id, record.name, record.value, record.error, fmt)
                session.vars[var.var_id] = var
                self.admission.budget.restore(session.session_id, var.var_id, var.value)
