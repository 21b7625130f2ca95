"""The one place a semantic call's state advances, and is journaled.

A call starts (its first chain is placed on an engine, or a transform starts on the
ServeCore) and settles (its outputs have values, or one failed); its output variables get
their values or errors. Each of these changes is made here, and written to the journal
here, in the order it happened.

The ledger sits *below* the scheduler and the variables: they are given it when they are
built (a dependency, as nano-vllm's scheduler is given its block manager) and tell it what
happened. It depends only on the journal, admission and the activity log, never on the
ServeCore or its services, so no lower layer calls back into a higher one.
"""

from __future__ import annotations

import time

from parrot.platform.serve.calls.graph import RequestChain, SemanticVariable
from parrot.platform.serve.calls.state import CallState
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.limits.admission import Admission
from parrot.platform.serve.ops.activity import ActivityLog


class CallLedger:
    def __init__(self, journal: Journal, admission: Admission, activity: ActivityLog) -> None:
        self.journal = journal
        self.admission = admission
        self.activity = activity

    def started(self, request: RequestChain, engine_id: str) -> None:
        """A chain of ``request`` was placed on ``engine_id`` (the call's first start is
        journaled: ``running``)."""
        request.engine_id = engine_id
        first = "started_at" not in request.timings
        request.timings.setdefault("started_at", time.time())
        if first and request.stored:
            self.journal.record(
                lambda store, t=dict(request.timings): store.update_call(
                    request.call_id, state=CallState.RUNNING, engine_id=engine_id, timings=t
                )
            )

    def first_token(self, request: RequestChain) -> None:
        """The first token of ``request`` came (journaled with its other timings when it
        settles)."""
        request.timings.setdefault("first_token_at", time.time())

    def var_settled(self, var: SemanticVariable) -> None:
        """``var`` got its value or its error (from :class:`Variables`). A value a client
        set is journaled by the set itself, before it is set (consumers start at once)."""
        if var.stored and var.error is not None:
            self.journal.record(lambda store: store.set_var_error(var.var_id, var.error))
        elif var.stored and var.producer is not None:
            self.journal.record(lambda store: store.set_var_value(var.var_id, var.value))
        if var.producer is not None:
            self._progressed(var.producer.request)

    def _progressed(self, request: RequestChain) -> None:
        state = request.state
        if not state.settled or "finished_at" in request.timings:
            return
        self.admission.call_settled(request.call_id)
        request.timings["finished_at"] = time.time()
        took = request.timings["finished_at"] - request.timings.get("submitted_at", 0.0)
        self.activity.call_finished(request.call_id, state, took, request.engine_id, request.error)
        if not request.stored:
            return
        self.journal.record(
            lambda store, t=dict(request.timings): store.update_call(
                request.call_id, state=state, engine_id=request.engine_id, error=request.error, timings=t
            )
        )
