"""A measurement repeated a few times: its median and its spread (min-max), and whether two
of them can be told apart at all on a shared machine."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    values: tuple[float, ...]

    def __init__(self, values: Iterable[float]) -> None:
        found = tuple(v for v in values if v == v)  # NaN: a run that did not measure it
        object.__setattr__(self, "values", found)

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def low(self) -> float:
        return min(self.values, default=float("nan"))

    @property
    def high(self) -> float:
        return max(self.values, default=float("nan"))

    def show(self, fmt: str = ".2f", scale: float = 1.0) -> str:
        """``median (min-max)``; just the value for a single run."""
        if not self.values:
            return "-"
        median = format(self.median * scale, fmt)
        if len(self.values) == 1:
            return median
        return f"{median} ({format(self.low * scale, fmt)}-{format(self.high * scale, fmt)})"

    def overlaps(self, other: Spread) -> bool:
        """The two ranges meet: a ratio of their medians says nothing reliable."""
        return self.low <= other.high and other.low <= self.high
