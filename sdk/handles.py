"""What sync and async sessions and variables share: their state, and the Ops they send.

:class:`SessionBase` and :class:`VarBase` build every request and read every answer; the
subclasses in :mod:`parrot.sdk.client` and :mod:`parrot.sdk.aclient` only send them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from parrot.sdk import ops, pipeline, streams
from parrot.sdk.config import DEFAULT_TIMEOUT_S, ClientConfig
from parrot.sdk.errors import ParrotError
from parrot.sdk.formats import ValueType
from parrot.sdk.http import Op, StreamOp
from parrot.sdk.ops import SessionKey
from parrot.sdk.params import Output
from parrot.sdk.pipeline import Pipeline
from parrot.sdk.results import CallInfo, CallSubmitted, SessionCreated, SessionInfo, SessionUsage, VarInfo
from parrot.wire.bodies import CallParameter, CallSpec, OutputRef, TransformInput
from parrot.wire.responses import CallsSubmitted
from parrot.wire.var_stream import VarDelta, VarValue

DEFAULT_WAIT_S = 300.0

# The session a ``with client.session()`` block runs in: semantic functions called in the
# block submit to it. A ContextVar, so threads and asyncio tasks each see their own.
CURRENT_SESSION: ContextVar[SessionBase | None] = ContextVar("parrot_current_session", default=None)


def current_session() -> SessionBase | None:
    """The session of the innermost ``with client.session()`` block around the caller."""
    return CURRENT_SESSION.get()


class VarBase:
    """A semantic variable of a session: a future of a text value.

    A typed one (made by an ``Output(schema=...)`` or ``Output(json_object=True)``, or one
    the server reports JSON-typed) is read as its :attr:`value_type` says: ``get()``
    returns the parsed value, ``get_text()`` the text."""

    def __init__(
        self,
        session: SessionBase,
        var_id: str | None,
        name: str,
        value: str | None = None,
        call_id: str | None = None,
    ) -> None:
        self.session = session
        self.var_id = var_id  # None while its call is queued in a pipelined session
        self.ref: OutputRef | None = None  # its place in that queue, until it is sent
        self.refused: ParrotError | None = None  # why the server refused that queued call
        self.name = name
        self.call_id = call_id  # the call that produces it, when this client submitted it
        self.value_type: ValueType | None = None
        self.finish_reason: str | None = None  # how its producer finished, once streamed to the end
        self._value = value
        self._parsed: tuple[str, Any] | None = None  # (text, its parsed value)

    @property
    def value(self) -> str | None:
        """The value once this client has seen it (set or got), else None; asks nothing."""
        return self._value

    def _keep(self, info: VarInfo) -> str:
        if self.value_type is None:
            self.value_type = ValueType.untyped_json(getattr(info, "format", None))
        self._value = info.value or ""
        return self._value

    def _read(self, text: str) -> Any:
        """The value of ``text`` as :attr:`value_type` reads it (parsed once)."""
        if self.value_type is None:
            return text
        if self._parsed is None or self._parsed[0] != text:
            self._parsed = (text, self.value_type.parse(text))
        return self._parsed[1]

    def _get_op(self, criteria: str, timeout: float) -> Op[str]:
        self._check_sent()
        return ops.get_var(self.session.key, self.var_id, criteria, timeout).then(self._keep)

    def _check_sent(self) -> None:
        if self.refused is not None:
            raise pipeline.refused(self)

    def _stream_op(
        self, criteria: str, timeout: float, close: bool = False, deltas: bool = True
    ) -> StreamOp[VarDelta | VarValue]:
        """Its stream; for a queued output, the queue sent with its stream as the answer
        (``close``: the session deleted when it ends; not ``deltas``: only the value comes)."""
        self._check_sent()
        if self.ref is not None:
            return pipeline.stream_op(self.session, self.ref, criteria, timeout, close, deltas)
        return streams.stream_var(self.session.key, self.var_id, criteria, timeout)

    def _piece(self, event: VarDelta | VarValue, so_far: int) -> str:
        """The text ``event`` of the variable's stream adds after the ``so_far`` characters
        already handed out. The value event (the last) is kept, so ``get()`` returns it at
        once; it adds what no delta carried (all of it, for a stream that starts after the
        value was set), so the pieces always join to the value."""
        if isinstance(event, VarDelta):
            return event.delta
        self._value = event.value
        self.finish_reason = event.finish_reason
        if self.value_type is None:
            self.value_type = ValueType.untyped_json(event.format)
        return event.value[so_far:]

    def _set_op(self, value: str) -> Op[None]:
        self._check_sent()

        def keep(_: VarInfo) -> None:
            self._value = value

        return ops.set_var(self.session.key, self.var_id, value).then(keep)

    def _ready_op(self) -> Op[bool]:
        self._check_sent()

        def ready(info: SessionInfo) -> bool:
            return any(v.var_id == self.var_id and v.ready for v in info.vars)

        return ops.session_info(self.session.key).then(ready)

    def _call_info_op(self) -> Op[CallInfo] | None:
        self._check_sent()
        if self.call_id is None:
            return None
        return ops.call_info(self.session.key, self.call_id)

    def __repr__(self) -> str:
        state = "pending" if self._value is None else f"value={self._value!r}"
        return f"{type(self).__name__}({self.name!r}, {self.var_id}, {state})"


V = TypeVar("V", bound=VarBase)


@dataclass
class Call(Generic[V]):
    """A submitted semantic call and its output variables by placeholder name (``call_id``
    is empty while the call is queued in a pipelined session)."""

    call_id: str
    outputs: dict[str, V]


def _reference(value: Any, what: str) -> dict[str, str | None]:
    """An input as the fields that name it: a Var by ``var_id``, a str as its ``value``."""
    if isinstance(value, VarBase):
        return {"var_id": value.var_id}
    if isinstance(value, str):
        return {"value": value}
    raise TypeError(f"{what} must be a Var or a str, not {type(value).__name__}")


def call_parameters(
    inputs: Mapping[str, VarBase | str], outputs: Mapping[str, Output], session: SessionBase
) -> list[CallParameter]:
    """The API's ``parameters`` list: inputs by var_id or value (a queued output of a
    pipelined ``session`` by its place in the queue), outputs with sampling."""
    params = [
        pipeline.reference(CallParameter(name=n, **_reference(value, f"input {n!r}")), value, session)
        for n, value in inputs.items()
    ]
    for name, output in outputs.items():
        if not isinstance(output, Output):
            raise TypeError(f"output {name!r} must be an Output, not {type(output).__name__}")
        params.append(output.parameter(name))
    return params


class SessionBase(Generic[V]):
    """A session on the server: ``session_id`` and ``session_auth`` (its secret)."""

    var_class: ClassVar[type]

    def __init__(
        self,
        client: ClientBase,
        key: SessionKey | None,
        pipelined: bool = False,
        label: str | None = None,
        tags: Sequence[str] = (),
    ) -> None:
        self.client = client
        self.key = key  # None: a pipelined session its first request has not made yet
        self.pipeline = Pipeline() if pipelined else None
        # What a pipelined session is made with, by its first request.
        self.label, self.tags = label, tuple(tags)
        self._tokens: list[Token] = []

    @property
    def session_id(self) -> str | None:
        return None if self.key is None else self.key.session_id

    @property
    def session_auth(self) -> str | None:
        return None if self.key is None else self.key.session_auth

    def accepted(self, answer: CallsSubmitted) -> None:
        """The queue, as the server took it (the session, when it made it)."""
        if self.key is None:
            assert answer.session_auth is not None, "a batch that made a session answers its auth"
            self.key = SessionKey(answer.session_id, answer.session_auth)
        assert self.pipeline is not None
        self.pipeline.apply(answer)

    def _refused(self, error: ParrotError) -> None:
        """A request that carried the queue failed: its calls do not exist."""
        if self.pipeline is not None and self.pipeline.queued:
            self.pipeline.refuse(error)

    def _made(self, created: SessionCreated) -> None:
        self.key = SessionKey(created.session_id, created.session_auth)

    def _pending_op(self) -> Op[None] | None:
        """What a pipelined session must send before any other request: its queue, or
        (when it has none and was never made) its creation."""
        if self.pipeline is None:
            return None
        if self.pipeline.queued:
            return pipeline.send_op(self)
        if self.key is None:
            return ops.create_session(self.label, self.tags).then(self._made)
        return None

    def _enter(self) -> None:
        self._tokens.append(CURRENT_SESSION.set(self))

    def _leave(self) -> None:
        CURRENT_SESSION.reset(self._tokens.pop())

    def _new_var(
        self, var_id: str | None, name: str, value: str | None = None, call_id: str | None = None
    ) -> V:
        return self.var_class(self, var_id, name, value, call_id)

    def _var_op(self, name: str, value: str | None) -> Op[V]:
        return ops.create_var(self.key, name, value).then(lambda i: self._new_var(i.var_id, i.name, value))

    def _submit_op(
        self,
        template: str,
        inputs: Mapping[str, VarBase | str],
        outputs: Mapping[str, Output],
        models: Sequence[str],
        output_criteria: str | None,
    ) -> Op[Call[V]]:
        params = call_parameters(inputs, outputs, self)

        def wrap(submitted: CallSubmitted) -> Call[V]:
            made = {}
            for name, var_id in submitted.output_ids().items():
                target = outputs[name].target
                made[name] = target or self._new_var(var_id, name, call_id=submitted.call_id)
                made[name].call_id = submitted.call_id
                made[name].value_type = outputs[name].value_type
            return Call(submitted.call_id, made)

        return ops.submit_call(self.key, template, params, models, output_criteria).then(wrap)

    def _queue(
        self,
        template: str,
        inputs: Mapping[str, VarBase | str],
        outputs: Mapping[str, Output],
        models: Sequence[str],
        output_criteria: str | None,
    ) -> Call[V]:
        """A call of a pipelined session, queued: its outputs are Vars with no id yet."""
        assert self.pipeline is not None
        params = call_parameters(inputs, outputs, self)
        made = {}
        for name, output in outputs.items():
            made[name] = output.target or self._new_var(None, name)
            made[name].value_type = output.value_type
        spec = CallSpec(
            template=template, parameters=params, models=list(models), output_criteria=output_criteria
        )
        call: Call[V] = Call("", made)
        self.pipeline.add(spec, call)
        return call

    def _transform_op(
        self, inputs: Sequence[VarBase | str], steps: Sequence[Mapping[str, Any]], output: str
    ) -> Op[V]:
        refs = [TransformInput(**_reference(value, f"transform input {n}")) for n, value in enumerate(inputs)]

        def wrap(submitted: CallSubmitted) -> V:
            return self._new_var(submitted.output_ids()[output], output, call_id=submitted.call_id)

        return ops.submit_transform(self.key, refs, steps, output).then(wrap)

    def _info_op(self) -> Op[SessionInfo]:
        return ops.session_info(self.key)

    def _call_info_op(self, call_id: str) -> Op[CallInfo]:
        return ops.call_info(self.key, call_id)

    def _usage_op(self, calls: Sequence[str | Call]) -> Op[SessionUsage]:
        return ops.session_usage(self.key, [c.call_id if isinstance(c, Call) else c for c in calls])

    def _delete_op(self) -> Op[None]:
        return ops.delete_session(self.key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.session_id!r})"


class ClientBase:
    """A client's configuration and transport (see :class:`ClientConfig` for the defaults)."""

    transport_class: ClassVar[type]

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        admin_token: str | None = None,
    ) -> None:
        self.config = ClientConfig.resolve(base_url, timeout, admin_token)
        self._transport = self.transport_class(self.config.base_url, self.config.timeout)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config.base_url!r})"
