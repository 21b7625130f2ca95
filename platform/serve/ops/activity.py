"""The ServeCore's activity in the log: one line per finished call at DEBUG, and at INFO a
summary per interval (a minute by default) of what finished in it. An idle interval writes
nothing, so a quiet server has a quiet log."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from parrot.platform.serve.calls.state import CallState

log = logging.getLogger("parrot.activity")


@dataclass
class _Window:
    done: int = 0
    failed: int = 0
    seconds: float = 0.0  # submitted -> finished, summed over the calls


class ActivityLog:
    def __init__(self, interval_s: float = 60.0) -> None:
        if interval_s <= 0:
            raise ValueError("the activity log's interval must be positive")
        self.interval_s = interval_s
        self._window = _Window()
        self._since = time.monotonic()

    def call_finished(
        self, call_id: str, state: CallState, seconds: float, engine_id: str | None, error: str | None = None
    ) -> None:
        """A call is done or failed, ``seconds`` after it was submitted."""
        window = self._window
        if state == CallState.DONE:
            window.done += 1
        else:
            window.failed += 1
        window.seconds += max(0.0, seconds)
        reason = f": {error}" if error else ""
        log.debug("call %s %s in %.3f s on %s%s", call_id, state, seconds, engine_id or "-", reason)

    def summarize(self, sessions: int, queued: int) -> None:
        """Write the interval's summary (when anything finished in it) and start the next."""
        window, now = self._window, time.monotonic()
        calls = window.done + window.failed
        if calls:
            log.info(
                "last %.0f s: %d calls done, %d failed, %.2f s per call; %d sessions, %d tasks queued",
                now - self._since, window.done, window.failed, window.seconds / calls, sessions, queued,
            )
        self._window, self._since = _Window(), now
