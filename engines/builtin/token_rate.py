"""The engine's generation rate: tokens per second over the last few seconds of steps.

It is read at every step (the engine publishes its statistics after each one, so a ping is
answered at once), so reading it must not cost a pass over the window: the window keeps the
sum of its tokens as steps enter and leave it.
"""

from __future__ import annotations

from collections import deque


class TokenRate:
    def __init__(self, window_s: float = 10.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._steps: deque[tuple[float, int]] = deque()  # (time.monotonic(), tokens) per step
        self._tokens = 0  # the sum of the steps' tokens

    def add(self, now: float, tokens: int) -> None:
        """A step that ended at ``now`` and generated ``tokens``."""
        self._steps.append((now, tokens))
        self._tokens += tokens
        self._forget(now)

    def per_s(self, now: float) -> float:
        """Tokens per second over the window's steps: those after its first step, over the time
        since that step ended (0 with fewer than two steps in the window)."""
        self._forget(now)
        if len(self._steps) < 2:
            return 0.0
        first_at, first_tokens = self._steps[0]
        span = now - first_at
        return (self._tokens - first_tokens) / span if span > 0 else 0.0

    def _forget(self, now: float) -> None:
        while self._steps and now - self._steps[0][0] > self.window_s:
            self._tokens -= self._steps.popleft()[1]
