"""Running the adapter's asyncio code from LangChain's synchronous methods."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
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
