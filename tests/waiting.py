"""Waiting on conditions, never for fixed times: a test goes on as soon as what it waits for
is true, and fails, naming it, if that does not happen in time (a fixed sleep is either too
long, wasting time, or too short on a loaded machine, failing at random)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
TIMEOUT_S = 60.0  # generous: a loaded 2-core machine; a condition that holds returns at once


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = TIMEOUT_S,
    what: str | None = None,
    interval_s: float = 0.01,
) -> T:
    """Poll ``predicate`` until it returns something true, and return that; AssertionError
    (naming ``what``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or _name(predicate)}")
        time.sleep(interval_s)
    return result


async def until(
    predicate: Callable[[], T | Awaitable[T]],
    timeout_s: float = TIMEOUT_S,
    what: str | None = None,
    interval_s: float = 0.01,
) -> T:
    """:func:`wait_until` on an event loop: ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or _name(predicate)}")
        await asyncio.sleep(interval_s)


def _name(predicate: Callable) -> str:
    name = getattr(predicate, "__name__", "")
    return "a condition" if name in ("", "<lambda>") else name
