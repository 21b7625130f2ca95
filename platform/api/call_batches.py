"""``POST /v1/semantic_calls``: a DAG of calls in one request, and with ``stream`` its
answer read in the same request, so an application of dependent calls (or a single call)
costs its client one round trip, as a plain OpenAI request does.

Without ``session_id`` the batch opens a session of its own; with ``close`` that session
(or the given one) is deleted once the streamed answer has ended, or its reader has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
from litestar import Controller, Request, Response, post
from litestar.params import JSONBody
from litestar.response.sse import ServerSentEventMessage

from parrot.engines.protocol.error_docs import BODY, CREATES, SESSION, STORE, VALUES, error_responses
from parrot.engines.protocol.errors import BadRequestError, ParrotError
from parrot.engines.protocol.event_stream import EventStream
from parrot.platform.api.auth import Sessions
from parrot.platform.api.bodies import call_request
from parrot.platform.api.deps import Core
from parrot.platform.api.var_stream_events import sse_messages
from parrot.platform.serve.contexts.manager import spawn
from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.sessions.session import Session
from parrot.wire.bodies import CallParameter, CallSpec, SubmitCalls
from parrot.wire.responses import CallsSubmitted, CallSubmitted, ParamInfo
from parrot.wire.var_stream import SUBMITTED, VarDelta, VarStreamError, VarValue

VarStreamEvent = VarDelta | VarValue | VarStreamError | None  # None: a keep-alive

_closing: set[asyncio.Task] = set()  # deletions of one-shot sessions, while they run


class CallBatchController(Controller):
    path = "/v1"

    @post(
        "/semantic_calls",
        status_code=201,
        responses=error_responses(BODY, SESSION, 409, CREATES, VALUES, STORE),
    )
    async def submit_calls(
        self, request: Request, data: JSONBody[SubmitCalls], sessions: Sessions, core: Core
    ) -> Response[CallsSubmitted]:
        """The calls, checked all before any is accepted. With ``stream``, the answer is an
        event stream: ``submitted`` (this answer's body), then the output's events."""
        if data.close and data.stream is None:
            raise BadRequestError("'close' deletes the session when the streamed output ends: give 'stream'")
        if not data.deltas and data.stream is None:
            raise BadRequestError("'deltas' is about the streamed output's events: give 'stream'")
        if data.stream is not None:
            _check_ref(data)
        auth = None
        if data.session_id is None:
            client = request.client.host if request.client else "unknown"
            # A one-shot batch (closed with its answer) is not stored, as an OpenAI
            # request is not: no client can come back to it, and it costs no writes.
            session, auth = await core.sessions.create(
                stored=not data.close, client=client, wait=False, label=data.label, tags=data.tags
            )
        elif data.label is not None or data.tags:
            raise BadRequestError(
                "'label' and 'tags' name the session a batch opens: leave them out with 'session_id'"
            )
        else:
            session = sessions(data.session_id)
        try:
            accepted = await core.calls.submit_batch(session, [call_request(c) for c in data.calls])
            submitted: list[CallSubmitted] = []
            for (call, outputs), spec in zip(accepted, data.calls, strict=True):
                submitted.append(_submitted(call.call_id, outputs, spec, submitted))
            answer = CallsSubmitted(session_id=session.session_id, session_auth=auth, calls=submitted)
            if data.stream is None:
                return Response(answer, status_code=201)
            var_id = answer.calls[data.stream.call].outputs[data.stream.output]
            events = core.streams.follow(session, var_id, data.criteria, data.deltas)
            if not data.deltas:
                events = _without_deltas(events)
        except BaseException:
            if auth is not None:  # the batch opened it: nothing of a refused batch is left
                with contextlib.suppress(ParrotError):
                    await core.sessions.delete(session)
            raise
        closing = session if data.close else None
        return EventStream(  # type: ignore[return-value]  # the same 201, as an event stream
            _answer(core, answer, sse_messages(events), closing),
            status_code=201,
            headers={"Cache-Control": "no-store"},
        )


def _check_ref(data: SubmitCalls) -> None:
    ref = data.stream
    assert ref is not None
    if ref.call >= len(data.calls):
        raise BadRequestError(f"stream: the batch has no call {ref.call}")
    outputs = [p.name for p in data.calls[ref.call].parameters if p.is_output]
    if ref.output not in outputs:
        raise BadRequestError(f"stream: call {ref.call} has no output {ref.output!r} (outputs: {outputs})")


def _submitted(
    call_id: str, outputs: dict[str, str], spec: CallSpec, earlier: list[CallSubmitted]
) -> CallSubmitted:
    """A call of the batch as ``POST /v1/semantic_call`` answers it; an input that is
    ``output_of`` an earlier call is named by that output's variable."""

    def var_id(p: CallParameter) -> str | None:
        if p.output_of is not None:
            return earlier[p.output_of.call].outputs[p.output_of.output]
        return outputs.get(p.name) or p.var_id

    info = [ParamInfo(name=p.name, is_output=p.is_output, var_id=var_id(p)) for p in spec.parameters]
    return CallSubmitted(call_id=call_id, outputs=outputs, param_info=info)


async def _without_deltas(events: AsyncIterator[VarStreamEvent]) -> AsyncIterator[VarStreamEvent]:
    async for event in events:
        if not isinstance(event, VarDelta):
            yield event


async def _answer(
    core: ServeCore,
    submitted: CallsSubmitted,
    messages: AsyncIterator[ServerSentEventMessage],
    closing: Session | None,
) -> AsyncIterator[ServerSentEventMessage]:
    try:
        yield ServerSentEventMessage(event=SUBMITTED, data=msgspec.json.encode(submitted).decode())
        async for message in messages:
            yield message
    finally:
        if closing is not None and not closing.closed:
            # Off the answer's path: the client has its value; freeing what the session
            # holds on the engines need not hold its response open.
            spawn(_closing, core.sessions.delete(closing, batch_frees=True))
