"""Running the adapter's asyncio code from LangChain's synchronous methods."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine that ``make()`` returns to completion and return its result.

    In a thread without an event loop it runs right here; called from inside a running
    loop (a notebook, an async application calling ``invoke``), it runs on a loop of its
    own in a worker thread, with the caller's context variables (the SDK's current
    session among them), while the caller's thread waits.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="parrot-langchain") as pool:
        return pool.submit(context.run, lambda: asyncio.run(make())).result()


def iterate_sync(make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """The items of the async iterator that ``make()`` returns, as they come.

    It runs on a loop of its own in a worker thread, with the caller's context variables
    (as :func:`run_sync` does, and whether or not the caller's thread runs a loop); its
    error is raised here. Closing this iterator early (a ``break``) cancels it there, so
    what it holds open (a session, a stream) is closed at once."""
    items: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()  # (an item?, it or the end)
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task]] = []
    started = threading.Event()

    async def pump() -> None:
        running.append((asyncio.get_running_loop(), asyncio.current_task()))
        started.set()
        try:
            async for item in make():
                items.put((True, item))
        except BaseException as error:  # handed to the caller's thread
            items.put((False, error))
        else:
            items.put((False, None))

    context = contextvars.copy_context()
    worker = threading.Thread(
        target=context.run, args=(asyncio.run, pump()), name="parrot-langchain-stream", daemon=True
    )
    worker.start()
    try:
        while True:
            more, item = items.get()
            if more:
                yield item
            elif item is None:
                return
            else:
                raise item
    finally:
        started.wait()
        loop, task = running[0]
        with contextlib.suppress(RuntimeError):  # its loop is closed: it has ended
            loop.call_soon_threadsafe(task.cancel)
        worker.join()
