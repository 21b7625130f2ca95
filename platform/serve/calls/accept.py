"""Accepting built calls: linked into their session's DAG, stored, and only then started.

The calls of a batch (one call is a batch of one) are linked in order; a call that a check
refuses undoes the ones linked before it, so a refused batch leaves nothing behind. The
batch is then stored in one transaction with the variables it made: a DAG submitted in one
request costs one commit before its calls start, not one commit per call in turn (eight
maps submitted together reached the engine over 41 ms, a commit apart, and the engine
started on the first alone).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.calls import graph
from parrot.platform.serve.calls.drive import CallDriver
from parrot.platform.serve.calls.graph import RequestChain
from parrot.platform.serve.errors import SessionClosedError
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.limits.admission import Admission
from parrot.platform.serve.scheduler.task import THROUGHPUT
from parrot.platform.serve.sessions.session import Session
from parrot.platform.serve.variables.service import VariableService
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.platform.store.models import call_record
from parrot.wire.formats import OutputFormat


@dataclass(frozen=True)
class PreparedCall:
    """A call checked and built, with what accepting it stores: the variables it binds by
    name (``fresh``: the new ones), its parameters as stored, and the formats it gives
    existing variables."""

    session: Session
    call: RequestChain
    bound: dict[str, SemanticVariable]
    fresh: list[SemanticVariable]
    stored: list[dict]
    template: str
    models: list[str]
    output_criteria: str | None
    retyped: Sequence[tuple[SemanticVariable, OutputFormat]] = ()


def in_batch(error: ParrotError, message: str) -> ParrotError:
    """``error`` of a call of a batch, its message saying which."""
    return type(error)(message, status=error.status)


class CallAcceptor:
    def __init__(
        self, journal: Journal, admission: Admission, vars: VariableService, driver: CallDriver
    ) -> None:
        self.journal = journal
        self.admission = admission
        self.vars = vars
        self.driver = driver

    async def accept(self, batch: Sequence[PreparedCall]) -> list[tuple[RequestChain, dict[str, str]]]:
        """Link, store and start the calls of one session (or raise, changing nothing);
        each call with its outputs' variable ids by name."""
        linked: list[tuple[PreparedCall, list[Any]]] = []
        for n, prepared in enumerate(batch):
            try:
                linked.append((prepared, self._link(prepared)))
            except ParrotError as error:
                self._unlink(p for p, _ in reversed(linked))
                if len(batch) == 1:
                    raise
                raise in_batch(error, f"call {n} of the batch: {error}") from None
        writes = [
            w for p, _ in linked for var, fmt in p.retyped if (w := self.vars.retype(var, fmt)) is not None
        ]
        session = batch[0].session
        if session.unconfirmed is not None:  # opened by this request: stored with its calls
            writes.insert(0, session.unconfirmed)
            session.unconfirmed = None
        stored = [(p, new_vars) for p, new_vars in linked if p.session.stored]
        if stored:  # the calls and their variables: one transaction, all or none
            calls = [_record(p) for p, _ in stored]
            new_vars = [v for _, made in stored for v in made]
            writes.append(self.journal.record(lambda db: db.add_calls(calls, new_vars)))
        try:
            await self.journal.commit(*writes)
        except ParrotError:
            self._unlink(p for p, _ in reversed(linked))
            raise
        for prepared, _ in linked:
            if prepared.session.closed:
                raise SessionClosedError(f"session {prepared.session.session_id!r} was deleted")
            criteria = prepared.output_criteria or THROUGHPUT
            self.driver.start(prepared.session, prepared.call, tuple(prepared.models), criteria)
        return [(p.call, p.call.outputs()) for p, _ in linked]

    def _link(self, prepared: PreparedCall) -> list[Any]:
        """Link the call into its session's DAG (or raise, changing nothing); the records
        of the variables it made, to store with it."""
        session, call, fresh = prepared.session, prepared.call, prepared.fresh
        self.admission.check_session_growth(
            session.session_id, len(session.vars), len(fresh), len(session.calls), 1
        )
        # Inputs given by value: charged to the session's values (429 / 507), all or none.
        charged = self.admission.budget.take(session.session_id, [(v.var_id, v.value) for v in fresh])
        try:
            self.admission.admit_call(call)
        except BaseException:
            self.admission.budget.give_back(charged)
            raise
        try:
            graph.add(call)
        except BaseException:
            self.admission.call_settled(call.call_id)
            self.admission.budget.give_back(charged)
            raise
        self.driver.number(call)
        for param in prepared.stored:
            param["var_id"] = prepared.bound[param["name"]].var_id
        session.calls[call.call_id] = call
        return [r for var in fresh if (r := self.vars.add(session, var)) is not None]

    def _unlink(self, calls: Iterable[PreparedCall]) -> None:
        """Undo :meth:`_link` (and the formats given): the calls never existed."""
        for prepared in calls:
            session, call = prepared.session, prepared.call
            self.admission.call_settled(call.call_id)
            graph.unlink(call)
            session.calls.pop(call.call_id, None)
            self.vars.forget(session, prepared.fresh)
            for var, _ in prepared.retyped:
                self.vars.untype(var)


def _record(prepared: PreparedCall) -> dict[str, Any]:
    call = prepared.call
    return call_record(
        call.call_id,
        prepared.session.session_id,
        call.seq,
        prepared.template,
        prepared.stored,
        prepared.models,
        prepared.output_criteria,
        dict(call.timings),
    )
