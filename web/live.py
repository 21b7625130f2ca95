"""Live updates: a page's live part re-rendered and sent as an SSE event when it changes.

At most one event per ``live_interval_s``; nothing is sent while nothing changed. A stream
ends when the client goes (Litestar cancels it on disconnect) or after ``live_max_s`` (the
browser's EventSource then connects again)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from parrot.engines.protocol.errors import ParrotError
from parrot.web.config import DashboardConfig

EVENT = "update"  # the event the pages' ``sse-swap`` takes


async def updates(
    render: Callable[[], str], config: DashboardConfig
) -> AsyncIterator[ServerSentEventMessage]:
    last = None
    deadline = time.monotonic() + config.live_max_s
    while time.monotonic() < deadline:
        try:
            html = render()
        except ParrotError as error:  # what it showed is gone (a session, an engine)
            yield ServerSentEventMessage(data=f'<p class="error">{_escape(str(error))}</p>', event=EVENT)
            return
        if html != last:
            last = html
            yield ServerSentEventMessage(data=html, event=EVENT)
        await asyncio.sleep(config.live_interval_s)


def _escape(message: str) -> str:
    from markupsafe import escape

    return str(escape(message))


def stream(render: Callable[[], str], config: DashboardConfig) -> ServerSentEvent:
    return ServerSentEvent(updates(render, config), headers={"Cache-Control": "no-store"})
