"""Rate-limited logging: a flood of the same line (a warning per refused connection, an
error per failed ``accept``) must not fill the disk. Records are "similar" when they come
from the same logger, at the same level, with the same message template (their arguments
may differ). Of similar records, ``burst`` pass per ``window_s``; the rest are counted, and
the next one that passes says how many were suppressed."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_KEYS = 4096  # distinct templates remembered; the least recently seen are forgotten
EXEMPT = frozenset({"parrot.access"})  # a line a request, by design (the access log)


@dataclass
class _Window:
    start: float
    passed: int = 0
    suppressed: int = 0


class RepeatFilter(logging.Filter):
    """A handler filter (a handler's filters see every record it emits, propagated ones too).
    Records below ``min_level`` (debug traces asked for on purpose) always pass."""

    def __init__(
        self,
        burst: int = 10,
        window_s: float = 60.0,
        min_level: int = logging.INFO,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if burst < 1 or window_s <= 0:
            raise ValueError("burst must be at least 1 and window_s positive")
        self.burst = burst
        self.window_s = window_s
        self.min_level = min_level
        self.clock = clock
        self._windows: OrderedDict[tuple, _Window] = OrderedDict()
        self._lock = threading.Lock()  # the engine thread logs too

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level or record.name in EXEMPT:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window.start >= self.window_s:
                suppressed = window.suppressed if window is not None else 0
                window = _Window(now)
                self._windows[key] = window
                if suppressed:
                    self._note(record, suppressed)
            self._windows.move_to_end(key)
            while len(self._windows) > MAX_KEYS:
                self._windows.popitem(last=False)
            if window.passed >= self.burst:
                window.suppressed += 1
                return False
            window.passed += 1
            return True

    def _note(self, record: logging.LogRecord, suppressed: int) -> None:
        note = f"[{suppressed} similar messages suppressed in the last {self.window_s:g} s]"
        record.msg = f"{record.msg} {note}"
