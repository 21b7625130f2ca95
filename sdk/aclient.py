"""The asyncio client: :class:`AsyncClient`, :class:`AsyncSession`, :class:`AsyncVar`.

The same requests as :mod:`parrot.sdk.client` (built in :mod:`parrot.sdk.handles`), sent
with ``await``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from typing import Any, TypeVar

from parrot.sdk import ops, streams
from parrot.sdk.chat import ChatReply, chat_completion
from parrot.sdk.errors import NotFoundError, ParrotError
from parrot.sdk.handles import DEFAULT_WAIT_S, Call, ClientBase, SessionBase, VarBase
from parrot.sdk.http import AsyncTransport, Op, StreamOp
from parrot.sdk.ops import SessionKey
from parrot.sdk.params import Output
from parrot.sdk.results import CallInfo, EngineInfo, Health, RenderedChat, SessionInfo, SessionUsage
from parrot.sdk.streams import CompletionDelta
from parrot.wire.bodies import RegisterEngine

T = TypeVar("T")


class AsyncVar(VarBase):
    """A semantic variable: ``await var.get()`` (or ``aget``) waits for its value."""

    session: AsyncSession

    async def get(self, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S) -> Any:
        """See :meth:`parrot.sdk.client.Var.get` (a typed variable's parsed value)."""
        return self._read(await self.get_text(criteria, timeout))

    aget = get

    async def get_text(self, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S) -> str:
        """See :meth:`parrot.sdk.client.Var.get_text`."""
        if self._value is not None:
            return self._value
        if self.ref is not None:  # queued: the queue is sent, answered with this stream
            return await self._read_all(criteria, timeout)
        await self.session.flush()
        return await self.session.send(self._get_op(criteria, timeout))

    async def _read_all(self, criteria: str, timeout: float, close: bool = False) -> str:
        # Only the value is wanted: the server leaves the deltas out of the stream.
        async for _ in self._stream(criteria, timeout, close, deltas=False):
            pass
        assert self._value is not None  # a stream ends with the value or raises
        return self._value

    def astream(self, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S) -> AsyncIterator[str]:
        """``async for piece in var.astream()``: see :meth:`parrot.sdk.client.Var.stream`."""
        return self._stream(criteria, timeout)

    async def _stream(
        self, criteria: str, timeout: float, close: bool = False, deltas: bool = True
    ) -> AsyncIterator[str]:
        if self._value is not None:
            if self._value:
                yield self._value
            return
        if self.ref is None:
            await self.session.flush()
        so_far = 0
        try:
            async for event in self.session.send_stream(self._stream_op(criteria, timeout, close, deltas)):
                piece = self._piece(event, so_far)
                so_far += len(piece)
                if piece:
                    yield piece
        except ParrotError as error:
            if self.ref is not None:  # refused with the queue it was in
                self.session._refused(error)
            raise

    stream = astream

    async def set(self, value: str) -> None:
        await self.session.flush()
        await self.session.send(self._set_op(value))

    async def is_ready(self) -> bool:
        if self._value is not None:
            return True
        await self.session.flush()
        return await self.session.send(self._ready_op())

    async def call_info(self) -> CallInfo | None:
        await self.session.flush()
        op = self._call_info_op()
        return None if op is None else await self.session.send(op)


class AsyncSession(SessionBase[AsyncVar]):
    """``async with client.session() as s:`` creates a session, deletes it at the end, and
    runs semantic functions called with ``await f.asubmit(...)`` inside the block in it."""

    var_class = AsyncVar
    client: AsyncClient

    async def flush(self) -> None:
        """See :meth:`parrot.sdk.client.Session.flush`."""
        op = self._pending_op()
        if op is not None:
            try:
                await self.send(op)
            except ParrotError as error:
                self._refused(error)
                raise

    async def send(self, op: Op[T]) -> T:
        return await self.client.send(op)

    def send_stream(self, op: StreamOp[T]) -> AsyncIterator[T]:
        return self.client.send_stream(op)

    async def __aenter__(self) -> AsyncSession:
        self._enter()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._leave()
        if exc_type is None and self.pipeline is not None and self.pipeline.queued:
            await self.flush()  # what the block submitted runs, and its refusals raise
        if self.key is None:
            return
        with contextlib.suppress(ParrotError if exc_type else NotFoundError):
            await self.delete()

    async def var(self, name: str, value: str | None = None) -> AsyncVar:
        await self.flush()
        return await self.send(self._var_op(name, value))

    async def submit(
        self,
        template: str,
        inputs: Mapping[str, AsyncVar | str] | None = None,
        outputs: Mapping[str, Output] | None = None,
        *,
        models: Sequence[str] = (),
        output_criteria: str | None = None,
    ) -> Call[AsyncVar]:
        """See :meth:`parrot.sdk.client.Session.submit`."""
        if self.pipeline is not None:
            return self._queue(template, inputs or {}, outputs or {}, models, output_criteria)
        return await self.send(
            self._submit_op(template, inputs or {}, outputs or {}, models, output_criteria)
        )

    async def transform(
        self, inputs: Sequence[AsyncVar | str], steps: Sequence[Mapping[str, Any]], output: str = "result"
    ) -> AsyncVar:
        await self.flush()
        return await self.send(self._transform_op(inputs, steps, output))

    async def info(self) -> SessionInfo:
        await self.flush()
        return await self.send(self._info_op())

    async def call_info(self, call_id: str) -> CallInfo:
        await self.flush()
        return await self.send(self._call_info_op(call_id))

    async def usage(self, calls: Sequence[str | Call] = ()) -> SessionUsage:
        """See :meth:`parrot.sdk.client.Session.usage`."""
        await self.flush()
        return await self.send(self._usage_op(calls))

    async def delete(self) -> None:
        await self.flush()
        await self.send(self._delete_op())


class _OpenSession:
    """What ``AsyncClient.session()`` returns: ``await`` it for a session, or use it in
    ``async with`` to have the session deleted at the end."""

    def __init__(
        self, client: AsyncClient, pipeline: bool, label: str | None = None, tags: Sequence[str] = ()
    ) -> None:
        self._client = client
        self._pipeline = pipeline
        self._label, self._tags = label, tags
        self._session: AsyncSession | None = None

    async def _create(self) -> AsyncSession:
        named = {"label": self._label, "tags": self._tags}
        if self._pipeline:
            return AsyncSession(self._client, None, pipelined=True, **named)
        created = await self._client.send(ops.create_session(self._label, self._tags))
        return AsyncSession(self._client, SessionKey(created.session_id, created.session_auth), **named)

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._create().__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._create()
        return await self._session.__aenter__()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._session is not None:
            await self._session.__aexit__(exc_type, exc, tb)


class AsyncClient(ClientBase):
    """An asyncio client of a Parrot server (see :class:`ClientConfig` for the defaults)."""

    transport_class = AsyncTransport

    async def send(self, op: Op[T]) -> T:
        return await self._transport.send(op)

    def send_stream(self, op: StreamOp[T]) -> AsyncIterator[T]:
        """The decoded events of a streamed response, as they arrive."""
        return self._transport.stream(op)

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def session(
        self, pipeline: bool = False, *, label: str | None = None, tags: Sequence[str] = ()
    ) -> _OpenSession:
        """``s = await client.session()``, or ``async with client.session() as s:``;
        ``pipeline``, ``label`` and ``tags``: see :meth:`parrot.sdk.client.Client.session`."""
        return _OpenSession(self, pipeline, label, tags)

    async def call(
        self, func: Any, *args: Any, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S, **kwargs: Any
    ) -> Any:
        """See :meth:`parrot.sdk.client.Client.call`."""
        var = await self._one_call(func, args, kwargs)
        return var._read(await var._read_all(criteria, timeout, close=True))

    async def stream_call(
        self, func: Any, *args: Any, criteria: str = "latency", timeout: float = DEFAULT_WAIT_S, **kwargs: Any
    ) -> AsyncIterator[str]:
        """See :meth:`parrot.sdk.client.Client.stream_call`."""
        var = await self._one_call(func, args, kwargs)
        async for piece in var._stream(criteria, timeout, close=True):
            yield piece

    async def _one_call(self, func: Any, args: tuple, kwargs: dict) -> AsyncVar:
        output = await func.asubmit(*args, session=AsyncSession(self, None, pipelined=True), **kwargs)
        if not isinstance(output, AsyncVar):
            raise TypeError(f"{func.__name__}() has {len(output)} outputs: run it in a session to read them")
        return output

    def attach(self, session_id: str, session_auth: str) -> AsyncSession:
        return AsyncSession(self, SessionKey(session_id, session_auth))

    async def render_chat(
        self, messages: Sequence[Mapping[str, str]], model: str | None = None
    ) -> RenderedChat:
        """See :meth:`parrot.sdk.client.Client.render_chat`."""
        return await self.send(ops.render_chat(messages, model))

    def stream_completion(
        self,
        prompt: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        **sampling: Any,
    ) -> AsyncIterator[CompletionDelta]:
        """``async for delta in client.stream_completion(...)``; see
        :meth:`parrot.sdk.client.Client.stream_completion`."""
        return self._transport.stream(streams.stream_completion(prompt, model, sampling, api_key, metadata))

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        model: str | None = None,
        api_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        **sampling: Any,
    ) -> AsyncIterator[CompletionDelta]:
        """See :meth:`parrot.sdk.client.Client.stream_chat`."""
        return self._transport.stream(streams.stream_chat(messages, model, sampling, api_key, metadata))

    async def chat(
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
        """See :meth:`parrot.sdk.client.Client.chat`."""
        options = {
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel_tool_calls,
            "response_format": response_format,
            "metadata": metadata,
        }
        return await self.send(chat_completion(messages, model, sampling, api_key, **options))

    async def engines(self) -> list[EngineInfo]:
        return await self.send(ops.list_engines())

    async def register_engine(self, url: str | None = None, **spec: Any) -> EngineInfo:
        """See :meth:`parrot.sdk.client.Client.register_engine`."""
        return await self.send(ops.register_engine(self.config.admin_token, RegisterEngine(url=url, **spec)))

    async def remove_engine(self, engine_id: str) -> None:
        await self.send(ops.remove_engine(self.config.admin_token, engine_id))

    async def healthz(self) -> Health:
        return await self.send(ops.healthz())

    async def metrics(self) -> dict[str, float]:
        return await self.send(ops.metrics())
