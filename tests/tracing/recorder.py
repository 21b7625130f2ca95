"""The recorder: a profile function (``sys.setprofile`` in every thread) that logs, while
active, the hand-offs of :mod:`tracing.handoffs` with the project frames on their stacks,
and the edges that say which unit of work each one reached.

A **unit** is what runs code in order: an asyncio task (all its steps), one run of a plain
loop callback, or a thread outside loop callbacks. An **edge** ``(src unit, src time) →
(dst unit, dst time)`` says the destination went on because of the source:

- a callback handle (a task's step or wake-up, a ``call_soon_threadsafe`` callback, a timer)
  runs because a unit made it: asyncio's futures and tasks wake their waiters through
  handles, so a resolved future reaches the tasks that awaited it, a finished task the
  tasks (or ``asyncio.wait`` callbacks) that waited on it;
- a get from a queue is reached by the put of the item it got (FIFO per queue), an event
  seen set (``wait`` or ``is_set`` returning True, suspended or not) by the latest ``set``;
- a new thread by the unit that started it.

Socket writes and reads are logged with their connection (local and peer address), so that
:mod:`tracing.causal` joins the processes' logs. Times are ``time.monotonic_ns()``: one clock
for all processes of a machine. Inactive, the profile function returns after one attribute
check; the wrapper (:mod:`tracing.run_traced`) activates it once the process has started.
"""

from __future__ import annotations

import _thread
import asyncio
import itertools
import json
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dis import opmap
from pathlib import Path
from time import monotonic_ns
from types import CodeType, FrameType

from tracing import handoffs as H

RETURN_VALUE = opmap["RETURN_VALUE"]  # a frame's last instruction when it returned (not raised, not yielded)
_MISSING = object()
COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})
RETURN_KINDS = frozenset({"handle made", "queue get", "event seen"})  # seen at their return only


class Recorder:
    def __init__(self, root: Path, is_project: Callable[[str], bool]) -> None:
        """``root``: where row file names are relative to; ``is_project(co_filename)``:
        whether a frame of that file is a project frame (a possible row)."""
        self.root = str(root)
        self.is_project = is_project
        self.active = False
        self._local = _thread._local()
        self._counter = itertools.count(1)  # next() is atomic: threads never share an id
        self.unit_names: dict[int, str] = {}
        # (time, unit, kind, project code ids outermost first, connection or None)
        self.handoffs: list[tuple] = []
        self.edges: list[tuple[int, int, int, int]] = []  # (src unit, src time, dst unit, dst time)
        self.reads: list[tuple[int, int, str]] = []  # (time, unit, connection)
        self.resumes: list[tuple[int, int, tuple]] = []  # (time, task unit, its await chain's rows)
        self._kinds: dict[CodeType, str] = {}
        self._rows: dict[CodeType, int] = {}  # project code -> id, others -> -1
        self.codes: list[CodeType] = []
        self._named = {(file, function) for file, function, *_ in H.NAMED_POINTS}
        # Keyed by id() with the object kept, so that an id reused after a free never matches.
        self._handles: dict[int, tuple[object, int, int]] = {}
        self._threads: dict[int, tuple[object, int, int]] = {}
        self._tasks: dict[int, tuple[asyncio.Task, int]] = {}
        self._fifos: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._sets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._code_bytes: dict[CodeType, bytes] = {}

    # -- installation ------------------------------------------------------------------------
    def install(self) -> None:
        """Profile this thread and every thread started from now on."""
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)

    def uninstall(self) -> None:
        """Stop profiling this thread and threads started from now on."""
        self.active = False
        sys.setprofile(None)
        threading.setprofile(None)

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.active:
            return
        if event == "call":
            kind = self._kind(frame.f_code)
            if kind:
                self._on_call(kind, frame)
        elif event == "return":
            kind = self._kind(frame.f_code)
            if kind:
                self._on_return(kind, frame, arg)
        elif event == "c_call":
            hook = H.C_HANDOFFS.get(arg.__name__)
            if hook is not None and isinstance(getattr(arg, "__self__", None), hook[0]):
                self._on_c_call(hook[1], frame, arg.__self__)
        elif event == "c_return":
            hook = H.C_CONSUMERS.get(arg.__name__)
            if hook is not None and isinstance(getattr(arg, "__self__", None), hook[0]):
                self._on_c_return(hook[1], arg.__self__)

    # -- units -------------------------------------------------------------------------------
    def _new_unit(self, name: str) -> int:
        unit = next(self._counter)
        self.unit_names[unit] = name
        return unit

    def _unit(self) -> int:
        try:
            return self._local.unit
        except AttributeError:  # the first event of this thread since activation
            thread = threading.current_thread()
            unit = self._local.base = self._local.unit = self._new_unit(f"thread {thread.name}")
            started = self._threads.pop(id(thread), None)
            if started is not None and started[0] is thread:
                self.edges.append((started[1], started[2], unit, monotonic_ns()))
            return unit

    def _task_unit(self, task: asyncio.Task) -> int:
        known = self._tasks.get(id(task))
        if known is not None and known[0] is task:
            return known[1]
        coro = task.get_coro()
        unit = self._new_unit(f"task {task.get_name()} {getattr(coro, '__qualname__', coro)}")
        self._tasks[id(task)] = (task, unit)
        return unit

    # -- events ------------------------------------------------------------------------------
    def _on_call(self, kind: str, frame: FrameType) -> None:
        now = monotonic_ns()
        if kind == "handle run":
            self._run_handle(frame.f_locals["self"], now)
            return
        if kind in RETURN_KINDS:
            return
        unit = self._unit()
        target = frame.f_locals.get("self")
        if kind == "handle cancelled":
            self._handles.pop(id(target), None)
        elif kind == "thread start":
            self._threads[id(target)] = (target, unit, now)
        elif frame.f_back is None or frame.f_back.f_code not in H.NOT_HANDOFFS:
            connection = _transport_connection(target) if kind == "socket write" else None
            self._handoff(now, unit, kind, frame, connection)
            self._remember(kind, target, unit, now)

    def _on_return(self, kind: str, frame: FrameType, arg: object) -> None:
        if kind == "handle run":
            self._unit()  # (when activated during this callback)
            self._local.unit = self._local.base
        elif kind == "handle made":  # arg: the handle
            self._handles[id(arg)] = (arg, self._unit(), monotonic_ns())
        elif kind == "event seen":
            if arg is True:
                self._link(self._sets.get(frame.f_locals["self"]))
        elif kind == "queue get" and self._returned(frame):
            self._take(frame.f_locals["self"])

    def _on_c_call(self, kind: str, frame: FrameType, target: object) -> None:
        if frame.f_code in H.NOT_HANDOFFS:
            return
        now = monotonic_ns()
        unit = self._unit()
        connection = _socket_connection(target) if kind == "socket write" else None
        self._handoff(now, unit, kind, frame, connection)
        self._remember(kind, target, unit, now)

    def _on_c_return(self, kind: str, target: object) -> None:
        if kind == "queue get":
            self._take(target)
        else:  # a socket read
            connection = _socket_connection(target)
            if connection is not None:
                self.reads.append((monotonic_ns(), self._unit(), connection))

    def _run_handle(self, handle: asyncio.Handle, now: int) -> None:
        """A callback starts: in its task's unit (a task's step or wake-up), else in one of
        its own; reached from the unit that made the handle."""
        self._unit()  # this thread's base unit exists
        owner = getattr(handle._callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            unit = self._task_unit(owner)
            self._resume(owner, unit, now)
        else:
            unit = self._new_unit(f"callback {getattr(handle._callback, '__qualname__', handle._callback)}")
        self._local.unit = unit
        made = self._handles.pop(id(handle), None)
        if made is not None and made[0] is handle:
            self.edges.append((made[1], made[2], unit, now))

    def _resume(self, task: asyncio.Task, unit: int, now: int) -> None:
        """The project frames of the await chain a task step resumes (outermost first)."""
        rows = []
        awaited = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            frame = frame or getattr(awaited, "gi_frame", None)
            if frame is not None and (row := self._row(frame.f_code)) >= 0:
                rows.append(row)
            awaited = (
                getattr(awaited, "cr_await", None)
                or getattr(awaited, "ag_await", None)
                or getattr(awaited, "gi_yieldfrom", None)
            )
        if rows:
            self.resumes.append((now, unit, tuple(rows)))

    # -- hand-offs and what they reach -------------------------------------------------------
    def _handoff(
        self, now: int, unit: int, kind: str, frame: FrameType | None, connection: str | None
    ) -> None:
        rows = []
        while frame is not None and frame.f_code is not H.HANDLE_RUN:
            row = self._row(frame.f_code)
            if row >= 0:
                rows.append(row)
            frame = frame.f_back
        self.handoffs.append((now, unit, kind, tuple(reversed(rows)), connection))

    def _remember(self, kind: str, target: object, unit: int, now: int) -> None:
        if kind == "queue put":
            fifo = self._fifos.get(target)
            if fifo is None:
                fifo = self._fifos[target] = deque()
            fifo.append((unit, now))
        elif kind == "event set":
            self._sets[target] = (unit, now)

    def _take(self, queue: object) -> None:
        fifo = self._fifos.get(queue)
        if fifo:
            self._link(fifo.popleft())

    def _link(self, source: tuple[int, int] | None) -> None:
        if source is not None:
            self.edges.append((source[0], source[1], self._unit(), monotonic_ns()))

    # -- code objects --------------------------------------------------------------------------
    def _kind(self, code: CodeType) -> str:
        kind = self._kinds.get(code, _MISSING)
        if kind is _MISSING:
            kind = H.PY_HANDOFFS.get(code) or H.CONSUMERS.get(code) or H.SCHEDULING.get(code) or ""
            if not kind and (self._relative(code.co_filename), code.co_qualname) in self._named:
                kind = H.NAMED_KIND
            self._kinds[code] = kind
        return kind

    def _row(self, code: CodeType) -> int:
        row = self._rows.get(code)
        if row is None:
            row = -1
            # A comprehension is part of its function (Python 3.12 inlines them).
            if self.is_project(code.co_filename) and code.co_name not in COMPREHENSIONS:
                row = len(self.codes)
                self.codes.append(code)
            self._rows[code] = row
        return row

    def _returned(self, frame: FrameType) -> bool:
        """Whether a frame returned (rather than raised): its last instruction."""
        code = frame.f_code
        raw = self._code_bytes.get(code)
        if raw is None:
            raw = self._code_bytes[code] = code.co_code
        return raw[frame.f_lasti] == RETURN_VALUE

    def _relative(self, filename: str) -> str:
        return os.path.relpath(filename, self.root) if filename.startswith(self.root) else filename

    # -- output ------------------------------------------------------------------------------
    def dump(self, path: Path, process: str) -> None:
        """Write the log as JSON (atomically: readers see the whole file or none)."""
        record = {
            "process": process,
            "pid": os.getpid(),
            "codes": [[self._relative(c.co_filename), c.co_qualname] for c in list(self.codes)],
            "units": {str(k): v for k, v in list(self.unit_names.items())},
            "handoffs": list(self.handoffs),
            "edges": list(self.edges),
            "reads": list(self.reads),
            "resumes": list(self.resumes),
        }
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(record))
        os.replace(partial, path)


def _address(name: object) -> str:
    return f"{name[0]}:{name[1]}" if isinstance(name, tuple) and len(name) >= 2 else str(name)


def _connection(local: object, peer: object) -> str | None:
    if not local or not peer:
        return None
    return f"{_address(local)}>{_address(peer)}"


def _transport_connection(transport: object) -> str | None:
    extra = getattr(transport, "_extra", {})
    return _connection(extra.get("sockname"), extra.get("peername"))


def _socket_connection(sock: object) -> str | None:
    try:
        return _connection(sock.getsockname(), sock.getpeername())
    except OSError:  # not connected (or closed)
        return None
