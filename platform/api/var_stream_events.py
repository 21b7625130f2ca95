"""A variable's stream events as server-sent events (names from :mod:`parrot.wire.var_stream`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from litestar.response.sse import ServerSentEventMessage

from parrot.wire.var_stream import DELTA, ERROR, VALUE, VarDelta, VarStreamError, VarValue


async def sse_messages(
    events: AsyncIterator[VarDelta | VarValue | VarStreamError | None],
) -> AsyncIterator[ServerSentEventMessage]:
    async for event in events:
        if event is None:
            yield ServerSentEventMessage(comment="keep-alive")
            continue
        name = DELTA if isinstance(event, VarDelta) else VALUE if isinstance(event, VarValue) else ERROR
        yield ServerSentEventMessage(event=name, data=msgspec.json.encode(event).decode())
