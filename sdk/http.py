"""Requests as values, and the two transports (sync and async) that send them.

An :class:`Op` says everything about one REST request and how to read its answer, so the
logic of every route is written once (in :mod:`parrot.sdk.ops`) and only the sending
differs between :class:`SyncTransport` and :class:`AsyncTransport`. A :class:`StreamOp` is
the same for a response of server-sent events. Error responses become the matching
:mod:`parrot.wire.errors` class here, in one place.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import httpx
import msgspec
from httpx_sse import EventSource, ServerSentEvent

from parrot.sdk.errors import ServerUnreachableError, error_for
from parrot.wire.errors import ErrorResponse

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Op(Generic[T]):
    """One REST request: route, body (a struct of the wire contract, sent as its JSON),
    credentials, and ``decode`` for a success response.

    ``wait_s`` is how long the server may hold the request on purpose (a get that waits
    for a value); it is added to the client's timeout.
    """

    method: str
    path: str
    decode: Callable[[httpx.Response], T]
    body: msgspec.Struct | None = None
    params: Mapping[str, Any] | None = None
    token: str | None = None
    wait_s: float = 0.0

    def then(self, func: Callable[[T], U]) -> Op[U]:
        """The same request, its decoded result passed through ``func``."""
        decode = self.decode
        return replace(self, decode=lambda response: func(decode(response)))  # type: ignore[arg-type]


def struct(kind: type[T]) -> Callable[[httpx.Response], T]:
    return lambda response: msgspec.json.decode(response.content, type=kind)


def text(response: httpx.Response) -> str:
    return response.text


def nothing(_: httpx.Response) -> None:
    return None


def _request(op: Op | StreamOp, timeout: float, accept: Mapping[str, str] | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {op.token}"} if op.token else {}
    headers |= accept or {}
    content = None
    if op.body is not None:
        content = msgspec.json.encode(op.body)
        headers["Content-Type"] = "application/json"
    return {
        "method": op.method,
        "url": op.path,
        "content": content,
        "params": op.params,
        "headers": headers,
        "timeout": timeout + op.wait_s,
    }


@dataclass(frozen=True)
class StreamOp(Generic[T]):
    """A request answered with server-sent events: each event, until one whose data is
    ``[DONE]`` or the end of the response, goes through ``decode`` (None: an event that
    carries nothing for the caller; an exception it raises ends the stream).

    ``wait_s`` is how long the server may go quiet on purpose (a variable's stream before
    its producer starts); it is added to the client's timeout, as for :class:`Op`."""

    path: str
    decode: Callable[[ServerSentEvent], T | None]
    body: msgspec.Struct | None = None
    token: str | None = None
    method: str = "POST"
    params: Mapping[str, Any] | None = None
    wait_s: float = 0.0


def _read(op: Op[T], response: httpx.Response) -> T:
    if response.is_success:
        return op.decode(response)
    raise _error(response)


def _error(response: httpx.Response) -> Exception:
    try:
        body = msgspec.json.decode(response.content, type=ErrorResponse).error
    except msgspec.DecodeError:  # not a Parrot error body (a proxy's page, ...): keep the text
        return error_for(response.status_code, None, response.text[:1000] or response.reason_phrase)
    return error_for(response.status_code, body.code, body.message)


def _stream_request(op: StreamOp, timeout: float) -> dict[str, Any]:
    return _request(op, timeout, SSE_HEADERS)


SSE_HEADERS = {"Accept": "text/event-stream", "Cache-Control": "no-store"}


def _event(op: StreamOp[T], event: ServerSentEvent) -> tuple[bool, T | None]:
    """(done, decoded) for one event."""
    return (True, None) if event.data == "[DONE]" else (False, op.decode(event))


def _unreachable(base_url: str, error: httpx.TransportError) -> ServerUnreachableError:
    return ServerUnreachableError(f"Parrot server {base_url} unreachable: {error!r}")


class SyncTransport:
    def __init__(self, base_url: str, timeout: float) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self._http = httpx.Client(base_url=base_url)

    def send(self, op: Op[T]) -> T:
        try:
            response = self._http.request(**_request(op, self.timeout))
        except httpx.TransportError as error:
            raise _unreachable(self.base_url, error) from error
        return _read(op, response)

    def stream(self, op: StreamOp[T]) -> Iterator[T]:
        """The decoded events of a streamed response, as they arrive."""
        try:
            with self._http.stream(**_stream_request(op, self.timeout)) as response:
                if not response.is_success:
                    response.read()
                    raise _error(response)
                for event in EventSource(response).iter_sse():
                    done, item = _event(op, event)
                    if done:
                        return
                    if item is not None:
                        yield item
        except httpx.TransportError as error:
            raise _unreachable(self.base_url, error) from error

    def close(self) -> None:
        self._http.close()


class AsyncTransport:
    def __init__(self, base_url: str, timeout: float) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self._http = httpx.AsyncClient(base_url=base_url)

    async def send(self, op: Op[T]) -> T:
        try:
            response = await self._http.request(**_request(op, self.timeout))
        except httpx.TransportError as error:
            raise _unreachable(self.base_url, error) from error
        return _read(op, response)

    async def stream(self, op: StreamOp[T]) -> AsyncIterator[T]:
        """See :meth:`SyncTransport.stream`."""
        try:
            async with self._http.stream(**_stream_request(op, self.timeout)) as response:
                if not response.is_success:
                    await response.aread()
                    raise _error(response)
                async for event in EventSource(response).aiter_sse():
                    done, item = _event(op, event)
                    if done:
                        return
                    if item is not None:
                        yield item
        except httpx.TransportError as error:
            raise _unreachable(self.base_url, error) from error

    async def close(self) -> None:
        await self._http.aclose()
