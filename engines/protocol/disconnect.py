"""Work that stops when its HTTP client goes away.

A request handler that waits long (a generation) runs its work against the connection: if
the client disconnects first (it gave up, it was cancelled, its process died), the work is
cancelled, so nothing keeps computing for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from litestar import Request

from parrot.engines.protocol.errors import ClientGoneError

T = TypeVar("T")


async def disconnected(request: Request) -> None:
    """Returns once the client has gone (the request body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """The result of ``work``; it is cancelled if the client disconnects first."""
    job = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        done, _ = await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not job.done():
            job.cancel()
    if job in done:
        return job.result()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await job  # its cancellation has run (the job dropped) before this returns
    raise ClientGoneError("the client closed the connection before the answer was ready")
