"""Following a variable's value as it is written (``GET /v1/semantic_var/{id}/stream``).

A follower reads the variable's :class:`~parrot.platform.serve.variables.stream.ValueStream`
from the start: one arriving late first gets everything generated so far in one delta, one
arriving after the value is set gets the value at once. The stream ends with the value
(``finish_reason`` of its producer) or with the reason it will never come (its producer
failed, its session was deleted). Followers are counted per variable and per session, and
bounded (429 naming the limit): following costs a connection and a wake per token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

from parrot.engines.protocol.errors import TooManyRequestsError
from parrot.platform.serve.calls.drive import CallDriver
from parrot.platform.serve.errors import ProducerFailedError, SessionClosedError
from parrot.platform.serve.limits.settings import Limits, describe
from parrot.platform.serve.scheduler.task import LATENCY
from parrot.platform.serve.sessions.session import Session
from parrot.platform.serve.variables.service import VariableService, check_criteria
from parrot.platform.serve.variables.variable import SemanticVariable
from parrot.wire.var_stream import ErrorDetail, VarDelta, VarStreamError, VarValue

Event = VarDelta | VarValue | VarStreamError
KEEPALIVE_S = 15.0  # an idle stream (a call still queued) says it is alive this often


class StreamService:
    def __init__(self, vars: VariableService, driver: CallDriver, limits: Limits) -> None:
        self.vars = vars
        self.driver = driver  # a latency-critical follower prioritizes the producers
        self.limits = limits
        self._per_session: Counter[str] = Counter()  # followers now, by session

    def follow(
        self, session: Session, var_id: str, criteria: str = LATENCY, deltas: bool = True
    ) -> AsyncIterator[Event | None]:
        """The events of ``var_id``'s stream (None: nothing new for a while, a keep-alive).
        Refuses at once (before any event) a variable that does not exist or one more
        follower than the limits allow. ``deltas``: the follower reads the text as it is
        generated (else only the value matters)."""
        var = self.vars.find(session, var_id)
        check_criteria(criteria, "criteria")
        self._admit(session.session_id, var)
        if criteria == LATENCY:
            self.driver.prioritize(session, [var])
        var.stream.readers += 1
        var.stream.live = var.stream.live or deltas
        self._per_session[session.session_id] += 1
        return self._events(session, var)

    def _admit(self, session_id: str, var: SemanticVariable) -> None:
        per_var, per_session = self.limits.max_subscribers_per_var, self.limits.max_subscribers_per_session
        if var.stream.readers >= per_var:
            raise TooManyRequestsError(
                f"variable {var.var_id!r} is streamed to {per_var} followers already: "
                f"{describe('max_subscribers_per_var', per_var)}"
            )
        if self._per_session[session_id] >= per_session:
            raise TooManyRequestsError(
                f"session {session_id!r} has {per_session} streams open already: "
                f"{describe('max_subscribers_per_session', per_session)}"
            )

    async def _events(self, session: Session, var: SemanticVariable) -> AsyncIterator[Event | None]:
        stream = var.stream
        try:
            # Settled already: the value (or the reason) at once, with no deltas.
            position = stream.position if var.settled.is_set() else 0
            while not var.settled.is_set():
                text, tokens, position = stream.read(position)
                if text or tokens:
                    yield VarDelta(delta=text, tokens=tokens)
                else:
                    waited = position
                    await stream.changed(KEEPALIVE_S)
                    if stream.position == waited and not var.settled.is_set():
                        yield None
            if var.error is not None:
                yield _failure(session, var)
                return
            text, tokens, position = stream.read(position)
            if text or tokens:
                yield VarDelta(delta=text, tokens=tokens)
            yield VarValue(
                value=var.value or "",
                finish_reason=stream.finish_reason,
                tokens=stream.token_count,
                format=var.format,
            )
        finally:
            stream.readers -= 1
            self._per_session[session.session_id] -= 1
            if self._per_session[session.session_id] <= 0:
                del self._per_session[session.session_id]


def _failure(session: Session, var: SemanticVariable) -> VarStreamError:
    error = (
        SessionClosedError(f"session {session.session_id!r} was deleted while streaming")
        if session.closed
        else ProducerFailedError(f"variable {var.name!r} has no value: {var.error}")
    )
    return VarStreamError(error=ErrorDetail(code=error.code, message=str(error), status=error.status_code))
