"""Live updates: a page's live part re-rendered and sent as an SSE event when it changes.

At most one event per ``live_interval_s``; nothing is sent while nothing changed. A stream
ends when the client goes (Litestar cancels it on disconnect) or after ``live_max_s`` (the
browser's EventSource then connects again).

A page that can be big (a session's DAG) is rendered in two steps: a snapshot of the state
taken on the event loop (consistent, and linear in the session), then the HTML drawn from it
in a worker thread, so a big session never stalls other requests. Its renders are shared
(:class:`SharedRenders`): every tab open on the same page gets the same render, made at most
once per interval, however many tabs there are.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from parrot.engines.protocol.errors import ParrotError
from parrot.engines.protocol.event_stream import EventStream
from parrot.web.config import DashboardConfig

EVENT = "update"  # the event the pages' ``sse-swap`` takes
MAX_SHARED = 256  # pages whose last render is kept (the least recently used go)
RENDERS = "parrot_live_renders"  # the dashboard Router's ``opt`` key of its SharedRenders


class SharedRenders:
    """The last render of each live page, shared by its subscribers."""

    def __init__(self) -> None:
        self._renders: OrderedDict[Hashable, tuple[float, asyncio.Future[str]]] = OrderedDict()

    async def get(
        self, key: Hashable, snapshot: Callable[[], Any], draw: Callable[[Any], str], max_age_s: float
    ) -> str:
        """The page's HTML, drawn from a fresh ``snapshot()`` unless one made less than
        ``max_age_s`` ago (or being made) exists. ``snapshot`` runs here, on the event loop
        (its errors go to this caller); ``draw`` in a worker thread, as a task of its own, so
        a subscriber that goes away does not cancel the render the others wait for."""
        now = time.monotonic()
        found = self._renders.get(key)
        if found is None or (found[1].done() and now - found[0] >= max_age_s):
            state = snapshot()
            drawing = asyncio.ensure_future(asyncio.to_thread(draw, state))
            drawing.add_done_callback(lambda f: f.cancelled() or f.exception())  # the waiters get it
            found = self._renders[key] = (now, drawing)
            while len(self._renders) > MAX_SHARED:
                self._renders.popitem(last=False)
        self._renders.move_to_end(key)
        try:
            return await asyncio.shield(found[1])
        except Exception:
            if self._renders.get(key) is found:
                del self._renders[key]  # the next subscriber tries afresh
            raise


async def updates(
    render: Callable[[], Any], config: DashboardConfig
) -> AsyncIterator[ServerSentEventMessage]:
    """``render()`` gives the HTML (or an awaitable of it) each interval."""
    last = None
    deadline = time.monotonic() + config.live_max_s
    while time.monotonic() < deadline:
        try:
            html = render()
            if not isinstance(html, str):
                html = await html
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


def stream(render: Callable[[], Any], config: DashboardConfig) -> ServerSentEvent:
    return EventStream(updates(render, config), headers={"Cache-Control": "no-store"})


def renders(request: Any) -> SharedRenders:
    """The shared renders of the dashboard that ``request`` is for (its Router's ``opt``)."""
    return request.route_handler.opt[RENDERS]
