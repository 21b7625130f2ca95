"""The application benchmark suite (``benchmarks/apps/``) runs: one workload in its smallest
configuration against the test session's engine, with a real ``parrot serve`` process.
Not a benchmark: no timing is checked, only that both sides did the same work."""

from __future__ import annotations

from benchmarks.apps.map_reduce import WORKLOAD
from benchmarks.apps.report import main_table
from benchmarks.apps.suite import Options, run_workload


def test_map_reduce_runs_and_both_sides_generate_the_same_tokens(engine_server):
    options = Options(size="smoke", rtts_ms=(20,), runs=1, engine_urls=(engine_server.url,), warm_up=False)
    results = run_workload(WORKLOAD, options)

    config = WORKLOAD.configs("smoke")[0]
    calls = config.maps + 1
    assert {(s.rtt_ms, s.side) for s in results.main} == {(20, side) for side in ("baseline", "parrot")}
    for sample in results.main:
        assert sample.work.generated == calls * config.output_tokens, sample
        assert sample.work.computed > sample.work.generated, sample  # prompts were computed too
        assert sample.metrics["seconds"] > 0
    assert "| 2 maps x 48 tok + reduce, 4 out | 20 |" in main_table(results)
