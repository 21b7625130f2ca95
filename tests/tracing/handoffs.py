"""What counts as handing control on: the one list the tracer uses.

A **hand-off** is a call of one of these while a project frame is on the stack; the project
frames on its stack are the path's rows (when the hand-off leads to the call's answer):

- Python's primitives: a task created, a future resolved, an item put on a queue, an event
  set, a callback sent to a loop from another thread, work sent to a thread pool, bytes
  written to a socket (:data:`PY_HANDOFFS`, :data:`C_HANDOFFS`);
- the builtin engine's two **project hand-off points** (:data:`NAMED_POINTS`), where data
  waits in a structure for another loop without a primitive. If one of them disappears or
  is renamed, :func:`check_named_points` fails: update this list with the code.

The rest tells the tracer *who was reached* (causality), not what is counted:
:data:`CONSUMERS` (the return of a get or wait), and the asyncio and threading internals in
:data:`SCHEDULING` (a callback handle made and run, a thread started).
"""

from __future__ import annotations

import _queue
import _socket
import asyncio
import asyncio.base_events
import asyncio.events
import asyncio.selector_events
import concurrent.futures.thread
import importlib
import queue
import threading
from types import CodeType

# Python-level primitives, by code object: the hand-off's kind. asyncio's put() and
# queue's put_nowait() call these, so each item counts once.
PY_HANDOFFS: dict[CodeType, str] = {
    asyncio.base_events.BaseEventLoop.create_task.__code__: "task",
    asyncio.base_events.BaseEventLoop.call_soon_threadsafe.__code__: "threadsafe callback",
    asyncio.Queue.put_nowait.__code__: "queue put",
    queue.Queue.put.__code__: "queue put",
    asyncio.Event.set.__code__: "event set",
    threading.Event.set.__code__: "event set",
    concurrent.futures.thread.ThreadPoolExecutor.submit.__code__: "thread pool",
    asyncio.selector_events._SelectorSocketTransport.write.__code__: "socket write",
}

# Calls of primitives made by these stdlib functions are not hand-offs: asyncio.Queue()
# sets its own "all items done" event when it is made.
NOT_HANDOFFS: frozenset[CodeType] = frozenset({asyncio.Queue.__init__.__code__})

# C primitives, by method name and the type they are called on (``c_call`` events).
C_HANDOFFS: dict[str, tuple[type, str]] = {
    "set_result": (asyncio.Future, "future"),
    "set_exception": (asyncio.Future, "future"),
    "put": (_queue.SimpleQueue, "queue put"),
    "put_nowait": (_queue.SimpleQueue, "queue put"),
    "send": (_socket.socket, "socket write"),
    "sendall": (_socket.socket, "socket write"),
}

# Consumers: the return of these links the consumer to what it got (``c_return`` for C).
CONSUMERS: dict[CodeType, str] = {
    asyncio.Queue.get_nowait.__code__: "queue get",  # asyncio's get() ends with get_nowait()
    queue.Queue.get.__code__: "queue get",  # and queue's get_nowait() calls get()
    asyncio.Event.wait.__code__: "event seen",
    asyncio.Event.is_set.__code__: "event seen",
    threading.Event.wait.__code__: "event seen",
    threading.Event.is_set.__code__: "event seen",
}
C_CONSUMERS: dict[str, tuple[type, str]] = {
    "get": (_queue.SimpleQueue, "queue get"),
    "get_nowait": (_queue.SimpleQueue, "queue get"),
    "recv": (_socket.socket, "socket read"),
    "recv_into": (_socket.socket, "socket read"),
}

# How control moves inside asyncio and threading (edges only, never rows).
SCHEDULING: dict[CodeType, str] = {
    asyncio.base_events.BaseEventLoop._call_soon.__code__: "handle made",
    asyncio.base_events.BaseEventLoop.call_at.__code__: "handle made",
    asyncio.events.Handle.cancel.__code__: "handle cancelled",
    asyncio.events.Handle._run.__code__: "handle run",
    threading.Thread.start.__code__: "thread start",
}
HANDLE_RUN = asyncio.events.Handle._run.__code__  # a callback's (or task step's) stack starts above it

# The builtin engine's hand-off points: (file, function, module, why data waits there).
NAMED_POINTS: tuple[tuple[str, str, str, str], ...] = (
    (
        "engines/builtin/jobs.py",
        "Outbox.post",
        "parrot.engines.builtin.jobs",
        "results wait here until the engine thread delivers them to the asyncio side",
    ),
    (
        "engines/builtin/local_scheduler.py",
        "LocalScheduler.add",
        "parrot.engines.builtin.local_scheduler",
        "a job waits here for a step of the engine thread",
    ),
)
NAMED_KIND = "project hand-off point"


def check_named_points() -> None:
    """Raise ``LookupError`` if a named hand-off point no longer exists in the code."""
    for file, function, module, _ in NAMED_POINTS:
        target = importlib.import_module(module)
        for part in function.split("."):
            target = getattr(target, part, None)
            if target is None:
                raise LookupError(
                    f"the project hand-off point {file}: {function} no longer exists: "
                    "update NAMED_POINTS in tests/tracing/handoffs.py"
                )
        code = target.__code__
        if not code.co_filename.endswith(file) or code.co_qualname != function:
            raise LookupError(f"{function} is no longer defined in {file}: update tests/tracing/handoffs.py")
