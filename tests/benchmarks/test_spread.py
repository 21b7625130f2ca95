"""Medians and spreads of the benchmarks' repeated runs, and the speed-ups the tables mark
as noise (no servers)."""

from __future__ import annotations

import math

from benchmarks.apps.report import compared
from benchmarks.apps.workload import Metric
from benchmarks.spread import Spread


def test_median_and_spread():
    s = Spread([3.0, 1.0, 2.0, float("nan")])
    assert (s.median, s.low, s.high) == (2.0, 1.0, 3.0)
    assert s.show(".1f") == "2.0 (1.0-3.0)"
    assert s.show(".0f", 1000) == "2000 (1000-3000)"
    assert Spread([0.5]).show() == "0.50"
    assert Spread([]).show() == "-" and math.isnan(Spread([]).median)


def test_a_speed_up_is_marked_where_the_ranges_overlap():
    seconds = Metric("seconds", "app s")
    assert compared(seconds, Spread([4.0, 4.2, 5.0]), Spread([2.0, 2.1, 2.5])) == "2.00x"
    assert compared(seconds, Spread([4.0, 4.2, 5.0]), Spread([2.0, 2.1, 4.1])) == "2.00x (overlap)"
    assert compared(seconds, Spread([4.0]), Spread([4.0])) == "1.00x"  # one run: nothing to tell
    rate = Metric("tok_per_s", "tok/s", higher_is_better=True)
    assert compared(rate, Spread([10.0, 11.0, 12.0]), Spread([20.0, 21.0, 22.0])) == "1.91x"
