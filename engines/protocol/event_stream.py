"""Server-sent event responses, for every event stream of the engines and the ServeCore.

Litestar's ``ServerSentEvent`` reads the first lines of each stream (its optional id,
comment and retry lines) through ``sync_to_thread``: a worker thread's round trip on every
streamed answer, a tenth of the ServeCore's CPU per single call in a py-spy profile of
``client.call`` (issue 35). :class:`EventStream` is the same response (it is one, for the
routes' types and OpenAPI documents) with its events encoded on the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage
from litestar.response.streaming import Stream

Event = ServerSentEventMessage | Mapping[str, Any] | str | bytes


class EventStream(ServerSentEvent):
    """``text/event-stream`` from an async iterable of events: a ``ServerSentEventMessage``,
    a mapping of its fields, or a ``str``/``bytes`` as the data of an unnamed event (what
    ``ServerSentEvent`` takes). The media type stays ``text/event-stream`` also where the
    route answers JSON otherwise (Litestar would give a returned stream the handler's media
    type; clients that check it, as httpx-sse does, would refuse the stream)."""

    def __init__(
        self,
        content: AsyncIterable[Event],
        *,
        headers: Mapping[str, str] | None = None,
        status_code: int | None = None,
    ) -> None:
        media = "text/event-stream"
        Stream.__init__(self, _encoded(content), media_type=media, headers=headers, status_code=status_code)

    def to_asgi_response(self, *args, **kwargs):
        return super().to_asgi_response(*args, **{**kwargs, "media_type": self.media_type})


async def _encoded(events: AsyncIterable[Event]) -> AsyncIterator[bytes]:
    async for event in events:
        if isinstance(event, ServerSentEventMessage):
            yield event.encode()
        elif isinstance(event, Mapping):
            yield ServerSentEventMessage(**event).encode()
        else:
            yield ServerSentEventMessage(data=event).encode()
