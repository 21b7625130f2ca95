"""Pipelined sessions: calls queued on the client and sent together.

A session made with ``client.session(pipeline=True)`` sends nothing when it is made or
when a call is submitted in it: the calls wait on the client (their output Vars have no
``var_id`` yet) until something needs the server — reading a Var, any other request of
the session, or the end of its block. Then every queued call goes in one request
(``POST /v1/semantic_calls``), which also makes the session the first time; and when what
needs the server is the stream (or the value) of a queued output, that stream is the
answer of the same request. So an application of dependent calls whose answer is read
once costs one round trip, not one per call, as plain requests to an OpenAI server do
when they have no dependencies at all.

A refused call raises where the queue is sent (the read), its message naming the call of
the batch; the server checks every call of a batch before it accepts any.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from httpx_sse import ServerSentEvent

from parrot.sdk.errors import ParrotError
from parrot.sdk.http import Op, StreamOp, struct
from parrot.sdk.streams import var_event
from parrot.wire.bodies import CallParameter, CallSpec, OutputRef, SubmitCalls
from parrot.wire.responses import CallsSubmitted
from parrot.wire.var_stream import SUBMITTED, VarDelta, VarValue

if TYPE_CHECKING:
    from parrot.sdk.handles import Call, SessionBase

PATH = "/v1/semantic_calls"


@dataclass
class Queued:
    """A call submitted in a pipelined session and not sent yet."""

    spec: CallSpec
    call: Call


class Pipeline:
    """The calls a pipelined session has queued, in order."""

    def __init__(self) -> None:
        self.queued: list[Queued] = []

    def __len__(self) -> int:
        return len(self.queued)

    def add(self, spec: CallSpec, call: Call) -> None:
        """Queue ``call``; its outputs are named in later calls by their place here."""
        position = len(self.queued)
        for name, var in call.outputs.items():
            var.ref = OutputRef(call=position, output=name)
        self.queued.append(Queued(spec, call))

    def body(
        self,
        session: SessionBase,
        stream: OutputRef | None,
        criteria: str,
        close: bool,
        deltas: bool = True,
    ) -> SubmitCalls:
        """The queue as one batch of ``session``: in it once it exists, else opening it
        (with its label and tags)."""
        key, opens = session.key, session.key is None
        return SubmitCalls(
            calls=[q.spec for q in self.queued],
            session_id=None if opens else key.session_id,
            stream=stream,
            criteria=criteria,
            close=close,
            deltas=deltas,
            label=session.label if opens else None,
            tags=list(session.tags) if opens else [],
        )

    def refuse(self, error: ParrotError) -> None:
        """The queue refused by the server: none of its calls exists, and reading one of
        their outputs (or passing it to a call) raises this error."""
        queued, self.queued = self.queued, []
        for q in queued:
            for var in q.call.outputs.values():
                var.ref = None
                var.refused = error

    def apply(self, answer: CallsSubmitted) -> None:
        """The queued calls as the server accepted them: their ids, their outputs' ids."""
        queued, self.queued = self.queued, []
        for q, submitted in zip(queued, answer.calls, strict=True):
            q.call.call_id = submitted.call_id
            for name, var in q.call.outputs.items():
                var.var_id = submitted.outputs[name]
                var.call_id = submitted.call_id
                var.ref = None


def reference(param: CallParameter, value: Any, session: SessionBase) -> CallParameter:
    """``param`` (an input bound to Var ``value`` by id) bound to ``value``'s place in the
    queue instead, when ``value`` is a queued output."""
    if getattr(value, "refused", None) is not None:
        raise refused(value)
    ref = getattr(value, "ref", None)
    if ref is None:
        return param
    if value.session is not session:
        raise ValueError(f"input {param.name!r} is an output of another session's call that is not sent yet")
    return msgspec.structs.replace(param, var_id=None, output_of=ref)


def refused(var: Any) -> ParrotError:
    """The error to raise for a read of ``var``, an output of a refused call."""
    error = var.refused
    return type(error)(f"the call of {var.name!r} was refused: {error}", status=error.status)


def send_op(session: SessionBase) -> Op[None]:
    """The queue in one request (the session made by it the first time)."""
    key = session.key
    body = session.pipeline.body(session, None, "latency", False)
    return Op("POST", PATH, struct(CallsSubmitted), body=body, token=key and key.session_auth).then(
        lambda answer: session.accepted(answer)
    )


def stream_op(
    session: SessionBase, ref: OutputRef, criteria: str, wait_s: float, close: bool, deltas: bool = True
) -> StreamOp[VarDelta | VarValue]:
    """The queue in one request whose answer is the stream of queued output ``ref``: its
    ``submitted`` event is applied as it comes (the output's Var gets its id), then the
    output's events as ``GET /v1/semantic_var/{id}/stream`` sends them (without its deltas
    unless ``deltas``)."""
    key = session.key
    body = session.pipeline.body(session, ref, criteria, close, deltas)
    return StreamOp(PATH, _events(session), body=body, token=key and key.session_auth, wait_s=wait_s)


def _events(session: SessionBase) -> Callable[[ServerSentEvent], VarDelta | VarValue | None]:
    def decode(event: ServerSentEvent) -> VarDelta | VarValue | None:
        if event.event == SUBMITTED:
            session.accepted(msgspec.json.decode(event.data, type=CallsSubmitted))
            return None
        return var_event(event)

    return decode
