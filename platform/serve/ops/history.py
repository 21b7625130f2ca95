"""A short history of the ServeCore's load, for the dashboard's sparklines.

A ring buffer of samples (throughput, queue length, running tasks), one per
``interval_s``, covering the last ``span_s`` seconds; the ServeCore samples it on a timer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class LoadSample:
    at: float  # unix seconds
    tokens_per_s: float  # generated, summed over the engines that are up
    queued: int  # tasks waiting for an engine
    running: int  # tasks placed on engines


class LoadHistory:
    def __init__(self, span_s: float = 300.0, interval_s: float = 1.0) -> None:
        if span_s <= 0 or interval_s <= 0:
            raise ValueError("span_s and interval_s must be positive")
        self.interval_s = interval_s
        self.span_s = span_s
        self._samples: deque[LoadSample] = deque(maxlen=int(span_s / interval_s) + 1)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: LoadSample) -> None:
        self._samples.append(sample)

    def samples(self) -> list[LoadSample]:
        """Oldest first."""
        return list(self._samples)
