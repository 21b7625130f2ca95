"""Slow clients: connections that open, send part of a request head, then trickle one more
header line every ``trickle_s`` until the server closes them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field


@dataclass
class FloodResult:
    opened: int = 0  # connections the server accepted (or at least that the client opened)
    refused: int = 0  # connections that could not be opened at all
    answered_408: int = 0  # closed by the server with 408 Request Timeout
    answered_503: int = 0  # refused by the server at its connection cap
    closed: int = 0  # closed by the server, whatever it said
    still_open: int = 0  # open when the flood ended (the server never closed them)
    lifetimes_s: list[float] = field(default_factory=list)  # open to closed by the server


async def _slow_client(
    host: str, port: int, trickle_s: float, until: float, stop: asyncio.Event, result: FloodResult
) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        result.refused += 1
        return
    result.opened += 1
    opened = time.monotonic()
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: flood\r\n")
        while time.monotonic() < until and not stop.is_set():
            try:
                data = await asyncio.wait_for(reader.read(256), timeout=trickle_s)
            except TimeoutError:
                writer.write(b"X-Slow: 1\r\n")  # one more header line, never the blank line
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                continue
            # the server spoke or closed: either way this client is done
            result.closed += 1
            result.lifetimes_s.append(time.monotonic() - opened)
            if data.startswith(b"HTTP/1.1 408"):
                result.answered_408 += 1
            elif data.startswith(b"HTTP/1.1 503"):
                result.answered_503 += 1
            return
        result.still_open += 1
    except ConnectionError:
        result.closed += 1
        result.lifetimes_s.append(time.monotonic() - opened)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def slow_flood(
    host: str,
    port: int,
    connections: int,
    duration_s: float,
    trickle_s: float = 0.5,
    ramp_s: float = 1.0,
    stop: asyncio.Event | None = None,
) -> FloodResult:
    """``connections`` slow clients, opened over ``ramp_s``, each kept trickling until the
    server closes it, ``duration_s`` is over or ``stop`` is set."""
    result = FloodResult()
    until = time.monotonic() + duration_s
    stop = stop or asyncio.Event()
    tasks = []
    for i in range(connections):
        tasks.append(asyncio.create_task(_slow_client(host, port, trickle_s, until, stop, result)))
        if ramp_s and i % 50 == 49:
            await asyncio.sleep(ramp_s * 50 / connections)
    await asyncio.gather(*tasks)
    return result
