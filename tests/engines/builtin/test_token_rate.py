"""The engine's tokens/s over its last steps, kept without a pass over the window."""

import pytest

from parrot.engines.builtin.token_rate import TokenRate


def test_the_rate_counts_the_steps_after_the_first_over_their_span():
    rate = TokenRate(window_s=10.0)
    assert rate.per_s(0.0) == 0.0
    rate.add(1.0, 4)
    assert rate.per_s(1.0) == 0.0  # one step: no span yet
    rate.add(2.0, 3)
    rate.add(3.0, 5)
    assert rate.per_s(3.0) == pytest.approx((3 + 5) / 2.0)
    assert rate.per_s(5.0) == pytest.approx((3 + 5) / 4.0)  # idle time lowers it


def test_steps_leave_the_window_and_an_idle_engine_reads_zero():
    rate = TokenRate(window_s=10.0)
    for t in range(20):  # a step a second, 2 tokens each
        rate.add(float(t), 2)
    assert rate.per_s(19.0) == pytest.approx(2.0)  # steps 9..19 in the window
    rate.add(19.5, 100)
    assert rate.per_s(19.5) == pytest.approx((2 * 9 + 100) / 9.5)  # steps 10..19.5, after step 10
    assert rate.per_s(29.6) == 0.0  # only the 19.5 step is left
    assert rate.per_s(40.0) == 0.0


def test_the_window_must_be_positive():
    with pytest.raises(ValueError, match="window_s must be positive"):
        TokenRate(window_s=0)
