"""The ServeCore's load history: a bounded ring of samples for the dashboard's sparklines."""

from __future__ import annotations

import pytest

from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.ops.history import LoadHistory, LoadSample


def test_history_keeps_the_last_span_only():
    history = LoadHistory(span_s=10, interval_s=2)
    for n in range(20):
        history.add(LoadSample(at=float(n), tokens_per_s=n, queued=n, running=0))
    samples = history.samples()
    assert len(samples) == 6 and samples[0].at == 14 and samples[-1].at == 19
    with pytest.raises(ValueError):
        LoadHistory(span_s=0)


def test_servecore_samples_its_load():
    core = ServeCore(history=LoadHistory(span_s=300, interval_s=1))
    sample = core.views.sample_load()
    assert sample.queued == 0 and sample.running == 0 and sample.tokens_per_s == 0
    assert core.views.load_history() == [sample]
    assert core.views.session_summaries() == []
