"""The HTTP server both programs (``parrot serve``, ``parrot engine``) run on: uvicorn's h11
protocol with the limits a server facing slow or hostile clients needs.

uvicorn has a keep-alive timeout, but a client that trickles its request head (or its body)
one byte at a time holds its connection, and a file descriptor, forever; enough of them and
the server can accept nothing, not even ``/healthz``. So:

- the request head must arrive within ``header_timeout_s`` of its first byte (of the
  connection, for the first request), the body within ``body_timeout_s`` of the head;
  a connection that misses it gets 408 and is closed;
- at most ``max_connections`` are open: at the cap, a new connection takes the place of the
  connection that has waited longest for a request head (a slow client, not a request in
  progress); only when every connection is busy with a request is the new one answered 503
  and closed, at once, without reading it;
- the soft file-descriptor limit is raised to the hard limit, and the cap kept below it, so
  ``accept`` never fails (asyncio logs every failed accept, with its traceback).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import resource
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from parrot.engines.protocol.error_responses import body_too_large

log = logging.getLogger(__name__)

TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
SHED_503 = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def too_large_413(limit: int) -> bytes:
    """The 413 of a body past ``max_body_bytes``, as the apps answer it."""
    error = body_too_large(limit)
    body = json.dumps({"error": {"code": error.code, "message": str(error)}}).encode()
    head = "HTTP/1.1 413 Content Too Large\r\ncontent-type: application/json\r\n"
    return f"{head}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body


FD_RESERVE = 0.25  # of the fd limit kept for everything else (engine clients, database, files)


@dataclass(frozen=True)
class ServerLimits:
    """Limits of the HTTP server (flags and ``PARROT_*`` variables in
    :mod:`parrot.cli.server_flags`)."""

    header_timeout_s: float = 10.0  # a request head arrives within this, from its first byte
    body_timeout_s: float = 60.0  # a request body arrives within this, from the end of its head
    keep_alive_s: float = 5.0  # an idle connection between two requests is closed after this
    max_connections: int = 2048  # open connections at most (kept below the fd limit)
    max_header_bytes: int = 64 * 1024  # a larger request head gets 400
    # Bytes of one request body as they arrive, whatever the route reads: past it the
    # connection closes (413 unless the app answered). The apps' own limit applies only to
    # a body a handler reads; POST /v1/session reads none, and a chunked body that never
    # ended went on until the body timeout (issue 37). None: the apps' limit only.
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
        if self.max_header_bytes < 1024:
            raise ValueError(f"max_header_bytes must be at least 1024, got {self.max_header_bytes}")
        if self.max_body_bytes is not None and self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be positive, got {self.max_body_bytes}")


def raise_fd_limit() -> int:
    """Raise the soft limit of open files to the hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as error:  # a platform that refuses: keep the old one
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, error)
    return soft


def connection_cap(limits: ServerLimits, fd_limit: int) -> int:
    """The connection cap actually used: the configured one, kept below the fd limit."""
    room = max(16, int(fd_limit * (1 - FD_RESERVE)))
    if limits.max_connections > room:
        log.warning(
            "max connections %d lowered to %d: the open-file limit is %d",
            limits.max_connections,
            room,
            fd_limit,
        )
    return min(limits.max_connections, room)


class ConnectionGuard:
    """The state one server's connections share: the cap, and the connections still
    waiting for a request head, oldest first (the first to give way at the cap)."""

    def __init__(self, limits: ServerLimits, cap: int) -> None:
        self.limits = limits
        self.cap = cap
        self.waiting: OrderedDict[GuardedH11Protocol, None] = OrderedDict()
        self.shed = 0  # connections refused at the cap (all busy)
        self.evicted = 0  # slow connections closed to make room
        self.timed_out = 0  # connections closed for a late head or body

    def make_room(self, connections: set) -> bool:
        """Before a new connection is served: False when it must be refused."""
        if len(connections) < self.cap:
            return True
        if not self.waiting:
            self.shed += 1
            log.warning("connection limit %d reached and every connection is busy: refusing", self.cap)
            return False
        oldest, _ = self.waiting.popitem(last=False)
        self.evicted += 1
        log.warning("connection limit %d reached: closing the one waiting longest for a request", self.cap)
        oldest.close_slow()
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and the connection cap of a
    :class:`ConnectionGuard` (passed with ``functools.partial``, see :func:`run`)."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._deadline: asyncio.TimerHandle | None = None
        self._body_bytes = 0  # of the current request's body, as received

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        admitted = self.guard.make_room(self.connections)
        super().connection_made(transport)
        if not admitted:
            transport.write(SHED_503)
            transport.close()
            return
        self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._clear_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # A new request's first bytes after a keep-alive pause start its head deadline.
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._wait_for_head()
        if self.conn.their_state is h11.SEND_BODY and self._over_body_limit(len(data)):
            return
        super().data_received(data)
        self._follow_state()

    def _over_body_limit(self, size: int) -> bool:
        """Count ``size`` more bytes of the request's body (chunk framing included); past
        the limit the connection closes, with 413 unless an answer has begun."""
        limit = self.guard.limits.max_body_bytes
        self._body_bytes += size
        if limit is None or self._body_bytes <= limit or self.transport.is_closing():
            return False
        self.guard.waiting.pop(self, None)
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(too_large_413(limit))
        self.transport.close()
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request (if any) starts its deadline with its first byte; until then
        # uvicorn's keep-alive timeout applies.
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self._clear_deadline()
        else:
            self._follow_state()

    def _follow_state(self) -> None:
        """Move the deadline along with what the client still has to send."""
        state = self.conn.their_state
        if state is h11.IDLE:
            return  # still reading a head: its deadline runs on
        if state is h11.SEND_BODY:
            if self in self.guard.waiting:  # the head just completed: the body's turn
                del self.guard.waiting[self]
                self._arm(self.guard.limits.body_timeout_s)
            return
        self._clear_deadline()  # the request is in: the app answers at its own pace

    def _wait_for_head(self) -> None:
        self._body_bytes = 0
        self.guard.waiting[self] = None
        self._arm(self.guard.limits.header_timeout_s)

    def _arm(self, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(seconds, self._timed_out)

    def _clear_deadline(self) -> None:
        self.guard.waiting.pop(self, None)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        self.guard.timed_out += 1
        self.close_slow()

    def close_slow(self) -> None:
        """Close a connection whose client is too slow: 408 unless an answer has begun."""
        self.guard.waiting.pop(self, None)
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(TIMEOUT_408)
        self.transport.close()


def run(
    app: Any,
    host: str,
    port: int,
    limits: ServerLimits,
    ready_message: str | None = None,
    stop: threading.Event | None = None,
    **options: Any,
) -> None:
    """``uvicorn.run`` with :class:`ServerLimits`; logging is left to the program's own
    configuration (its handlers rate-limit repeated lines). ``ready_message`` is printed once
    the socket is bound and the app started, never before (a port taken by another process
    must not first be announced as served). ``stop``: once set (from any thread), the server
    shuts down as on Ctrl-C."""
    import uvicorn

    guard = ConnectionGuard(limits, connection_cap(limits, raise_fd_limit()))
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=functools.partial(GuardedH11Protocol, guard=guard),  # type: ignore[arg-type]
        timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
        h11_max_incomplete_event_size=limits.max_header_bytes,
        log_config=None,
        **options,
    )
    server = uvicorn.Server(config)

    async def watch(event: threading.Event) -> None:
        while not event.is_set():
            await asyncio.sleep(0.1)
        server.should_exit = True

    async def serve() -> None:
        serving = asyncio.ensure_future(server.serve())
        watcher = asyncio.ensure_future(watch(stop)) if stop is not None else None
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started and ready_message:
            print(ready_message, flush=True)
        try:
            await serving
        finally:
            if watcher is not None:
                watcher.cancel()

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(serve())
    if not server.started:
        raise SystemExit(3)  # as uvicorn.run: the server never started (its error is logged)
