"""The synchronous client: :class:`Client`, :class:`Session`, :class:`Var`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from parrot.sdk import ops, streams
from parrot.sdk.chat import ChatReply, chat_completion
from parrot.sdk.errors import NotFoundError, ParrotError
from parrot.sdk.handles import DEFAULT_WAIT_S, Call, ClientBase, SessionBase, VarBase
from parrot.sdk.http import Op, StreamOp, SyncTransport
from parrot.sdk.ops import SessionKey
from parrot.sdk.params import Output
from parrot.sdk.results import CallInfo, EngineInfo, Health, RenderedChat, SessionInfo, SessionUsage
from parrot.sdk.streams import CompletionDelta
from parrot.wire.bodies import RegisterEngine

T = TypeVar("T")


class Var(VarBase):
    """A semantic variable: a future of a text value, produced by a call or set by you."""

    session: Session

    def get(self, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S) -> Any:
        """Wait for the value. ``criteria="latency"`` makes its producers latency-critical;
        ``"throughput"`` lets them be batched. Raises :class:`WaitTimeoutError` after
        ``timeout`` seconds and :class:`ProducerFailedError` when it will never come.

        The text, or for a JSON-typed variable its parsed value: an instance of the model
        of ``Output(schema=Model)``, else the parsed JSON (a dict for a dict schema or
        ``json_object``)."""
        return self._read(self.get_text(criteria, timeout))

    def get_text(self, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S) -> str:
        """Wait for the value (see :meth:`get`) and return its text, as generated."""
        if self._value is not None:
            return self._value
        if self.ref is not None:  # queued: the queue is sent, answered with this stream
            return self._read_all(criteria, timeout)
        self.session.flush()
        return self.session.send(self._get_op(criteria, timeout))

    def _read_all(self, criteria: str, timeout: float, close: bool = False) -> str:
        # Only the value is wanted: the server leaves the deltas out of the stream.
        for _ in self._stream(criteria, timeout, close, deltas=False):
            pass
        assert self._value is not None  # a stream ends with the value or raises
        return self._value

    def stream(self, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S) -> Iterator[str]:
        """The value's text as it is generated, piece by piece: ``for piece in var.stream()``.
        The pieces join to the value; after the loop :attr:`value` holds it (``get()``
        returns at once) and :attr:`finish_reason` says how its producer finished. A
        variable whose value is there already yields it whole. ``criteria`` as for
        :meth:`get`; ``timeout``: how long the stream may go without an event. Raises
        :class:`ProducerFailedError` when the value will never come, :class:`NotFoundError`
        when the session is deleted meanwhile."""
        return self._stream(criteria, timeout)

    def _stream(
        self, criteria: str, timeout: float, close: bool = False, deltas: bool = True
    ) -> Iterator[str]:
        if self._value is not None:
            if self._value:
                yield self._value
            return
        if self.ref is None:
            self.session.flush()
        so_far = 0
        try:
            for event in self.session.send_stream(self._stream_op(criteria, timeout, close, deltas)):
                piece = self._piece(event, so_far)
                so_far += len(piece)
                if piece:
                    yield piece
        except ParrotError as error:
            if self.ref is not None:  # refused with the queue it was in
                self.session._refused(error)
            raise

    def set(self, value: str) -> None:
        """Give the variable its value (once; not for outputs of a call)."""
        self.session.flush()
        self.session.send(self._set_op(value))

    @property
    def ready(self) -> bool:
        """Whether it has a value (asks the server until this client has seen one)."""
        if self._value is not None:
            return True
        self.session.flush()
        return self.session.send(self._ready_op())

    def call_info(self) -> CallInfo | None:
        """The state and timings of the call that produces it (None when it was made
        with ``session.var``, or produced by a call this client did not submit)."""
        self.session.flush()
        op = self._call_info_op()
        return None if op is None else self.session.send(op)


class Session(SessionBase[Var]):
    """A session on the server. ``with client.session() as s:`` deletes it at the end, and
    semantic functions called inside the block run in it."""

    var_class = Var
    client: Client

    def flush(self) -> None:
        """Send what a pipelined session has queued (see :mod:`parrot.sdk.pipeline`); made
        by its first request, the session exists on the server afterwards."""
        op = self._pending_op()
        if op is not None:
            try:
                self.send(op)
            except ParrotError as error:
                self._refused(error)
                raise

    def send(self, op: Op[T]) -> T:
        return self.client.send(op)

    def send_stream(self, op: StreamOp[T]) -> Iterator[T]:
        return self.client.send_stream(op)

    def __enter__(self) -> Session:
        self._enter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._leave()
        if exc_type is None and self.pipeline is not None and self.pipeline.queued:
            self.flush()  # what the block submitted runs, and its refusals raise
        if self.key is None:
            return
        # Deleting must not hide the error that ended the block.
        with contextlib.suppress(ParrotError if exc_type else NotFoundError):
            self.delete()

    def var(self, name: str, value: str | None = None) -> Var:
        """A new variable, with a value or (to be set or generated later) without."""
        self.flush()
        return self.send(self._var_op(name, value))

    def submit(
        self,
        template: str,
        inputs: Mapping[str, Var | str] | None = None,
        outputs: Mapping[str, Output] | None = None,
        *,
        models: Sequence[str] = (),
        output_criteria: str | None = None,
    ) -> Call[Var]:
        """A semantic call: ``template`` with ``{{name}}`` placeholders, each one an input
        (a Var or a str) or an output; returns at once with the output variables (in a
        pipelined session, queued: see :mod:`parrot.sdk.pipeline`)."""
        if self.pipeline is not None:
            return self._queue(template, inputs or {}, outputs or {}, models, output_criteria)
        return self.send(self._submit_op(template, inputs or {}, outputs or {}, models, output_criteria))

    def transform(
        self, inputs: Sequence[Var | str], steps: Sequence[Mapping[str, Any]], output: str = "result"
    ) -> Var:
        """A variable derived from ``inputs`` on the server by string ``steps`` (strip,
        lower, upper, regex, json_field, join, split_take, format), without an LLM."""
        self.flush()
        return self.send(self._transform_op(inputs, steps, output))

    def info(self) -> SessionInfo:
        self.flush()
        return self.send(self._info_op())

    def call_info(self, call_id: str) -> CallInfo:
        self.flush()
        return self.send(self._call_info_op(call_id))

    def usage(self, calls: Sequence[str | Call] = ()) -> SessionUsage:
        """Token usage of the session's calls (of ``calls``, ids or Calls, when given)."""
        self.flush()
        return self.send(self._usage_op(calls))

    def delete(self) -> None:
        """Delete the session and free everything it holds on the server."""
        self.flush()
        self.send(self._delete_op())


class Client(ClientBase):
    """A client of a Parrot server (see :class:`ClientConfig` for the defaults)."""

    transport_class = SyncTransport

    def send(self, op: Op[T]) -> T:
        return self._transport.send(op)

    def send_stream(self, op: StreamOp[T]) -> Iterator[T]:
        """The decoded events of a streamed response, as they arrive."""
        return self._transport.stream(op)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def session(
        self, pipeline: bool = False, *, label: str | None = None, tags: Sequence[str] = ()
    ) -> Session:
        """A new session, created now; use it in a ``with`` block to delete it at the end.
        ``pipeline``: made by its first request instead, its calls queued and sent together
        when something needs the server (see :mod:`parrot.sdk.pipeline`). ``label`` (1 to
        200 characters) and ``tags`` (up to 16, each 1 to 64) are what the dashboard's
        sessions page finds it by; ``session.info()`` returns them."""
        if pipeline:
            return Session(self, None, pipelined=True, label=label, tags=tags)
        created = self.send(ops.create_session(label, tags))
        return Session(self, SessionKey(created.session_id, created.session_auth), label=label, tags=tags)

    def call(
        self, func: Any, *args: Any, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S, **kwargs: Any
    ) -> Any:
        """``func(*args, **kwargs)``, a semantic function of one output, run in one round
        trip (a session of its own, made and deleted by the same request); its output's
        value (parsed, for a typed one)."""
        var = self._one_call(func, args, kwargs)
        return var._read(var._read_all(criteria, timeout, close=True))

    def stream_call(
        self, func: Any, *args: Any, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S, **kwargs: Any
    ) -> Iterator[str]:
        """:meth:`call`, its output's text streamed as it is generated."""
        return self._one_call(func, args, kwargs)._stream(criteria, timeout, close=True)

    def _one_call(self, func: Any, args: tuple, kwargs: dict) -> Var:
        output = func(*args, session=Session(self, None, pipelined=True), **kwargs)
        if not isinstance(output, Var):
            raise TypeError(f"{func.__name__}() has {len(output)} outputs: run it in a session to read them")
        return output

    def attach(self, session_id: str, session_auth: str) -> Session:
        """A session created earlier (by this or another client)."""
        return Session(self, SessionKey(session_id, session_auth))

    def render_chat(self, messages: Sequence[Mapping[str, str]], model: str | None = None) -> RenderedChat:
        """``messages`` (``role``, ``content``) as one prompt in the model's chat template."""
        return self.send(ops.render_chat(messages, model))

    def stream_completion(
        self,
        prompt: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        **sampling: Any,
    ) -> Iterator[CompletionDelta]:
        """Generate after ``prompt`` (sent as it is), yielding the text as it is produced;
        ``sampling``: any :class:`SamplingParams` field but ``stop_token_ids``. ``api_key``
        only where the server requires keys for its OpenAI-compatible routes; ``metadata``
        as for :meth:`chat`."""
        return self._transport.stream(streams.stream_completion(prompt, model, sampling, api_key, metadata))

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        model: str | None = None,
        api_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        **sampling: Any,
    ) -> Iterator[CompletionDelta]:
        """The assistant's reply to ``messages`` (rendered by the server with the model's
        chat template), as it is produced; ``metadata`` as for :meth:`chat`; see
        :meth:`stream_completion`."""
        return self._transport.stream(streams.stream_chat(messages, model, sampling, api_key, metadata))

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        api_key: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: Mapping[str, Any] | None = None,
        metadata: Mapping[str, str] | None = None,
        **sampling: Any,
    ) -> ChatReply:
        """The assistant's answer to ``messages`` (OpenAI's shapes: tool results and
        assistant ``tool_calls`` included), not streamed: its text or the tools it calls.
        ``tools`` (OpenAI function tools), ``tool_choice`` (``auto``, ``none``,
        ``required`` or a named function), ``parallel_tool_calls`` and
        ``response_format`` (``json_object`` / ``json_schema``) are sent when given;
        ``metadata`` (OpenAI's: a ``label`` and other keys, as tags) names the request on
        the dashboard's requests page; ``sampling`` as for :meth:`stream_chat`."""
        options = {
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel_tool_calls,
            "response_format": response_format,
            "metadata": metadata,
        }
        return self.send(chat_completion(messages, model, sampling, api_key, **options))

    def engines(self) -> list[EngineInfo]:
        return self.send(ops.list_engines())

    def register_engine(self, url: str | None = None, **spec: Any) -> EngineInfo:
        """Register a builtin engine at ``url``, or an OpenAI-compatible one with
        ``kind="openai", base_url=..., model=..., api_key=..., api="chat"``; ``capacity``
        (the fields of :class:`parrot.wire.bodies.RegisterEngine`: another name is a
        ``TypeError``)."""
        return self.send(ops.register_engine(self.config.admin_token, RegisterEngine(url=url, **spec)))

    def remove_engine(self, engine_id: str) -> None:
        self.send(ops.remove_engine(self.config.admin_token, engine_id))

    def healthz(self) -> Health:
        return self.send(ops.healthz())

    def metrics(self) -> dict[str, float]:
        """The Prometheus samples: {``name{labels}``: value}."""
        return self.send(ops.metrics())
