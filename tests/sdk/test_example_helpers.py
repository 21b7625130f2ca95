"""The examples' printing helpers (no server): the server's timings shown as durations,
and two ways of running a chain compared over several runs without claiming a ratio the
spread does not support."""

from __future__ import annotations

import pytest
from conftest import REPO_ROOT


@pytest.fixture
def helpers(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "examples"))  # as when a script runs
    import durations
    import timed_session

    return durations, timed_session


def test_timings_print_as_durations_from_the_first_submission(helpers):
    durations, _ = helpers
    t = 1_764_000_000.0
    result = {
        "summary": "short",
        "steps": [
            {"call": {"state": "done", "timings": {"submitted_at": t + 0.5, "started_at": t + 2.0}}},
            {
                "call": {
                    "timings": {
                        "submitted_at": t,
                        "started_at": t + 0.25,
                        "first_token_at": t + 0.75,
                        "finished_at": t + 1.5,
                    }
                }
            },
        ],
    }
    shown = durations.readable(result)
    assert shown["summary"] == "short" and shown["steps"][0]["call"]["state"] == "done"
    assert shown["steps"][0]["call"]["timings"] == {
        "submitted": "+0.50 s",
        "started": "+2.00 s",
        "waited": "1.50 s",
    }
    assert shown["steps"][1]["call"]["timings"] == {
        "submitted": "+0.00 s",
        "started": "+0.25 s",
        "first token": "+0.75 s",
        "finished": "+1.50 s",
        "took": "1.50 s",
        "waited": "0.25 s",
    }
    assert result["steps"][1]["call"]["timings"]["submitted_at"] == t  # the result is not changed


def test_each_run_of_calls_counts_from_its_own_first_submission(helpers):
    durations, _ = helpers
    calls = [{"timings": {"submitted_at": 100.0}}, {"timings": {"submitted_at": 100.5}}]
    run = {"seconds": 1.0, "calls": calls}
    later = {"seconds": 1.0, "calls": [{"timings": {"submitted_at": 110.0}}]}
    shown = durations.readable({"first": run, "second": later})
    assert [c["timings"]["submitted"] for c in shown["first"]["calls"]] == ["+0.00 s", "+0.50 s"]
    assert shown["second"]["calls"][0]["timings"]["submitted"] == "+0.00 s"


def test_with_durations_keeps_the_description_of_the_example(helpers):
    durations, _ = helpers

    def main(server_url: str) -> dict:
        return {"call": {"timings": {"submitted_at": 10.0, "finished_at": 12.5}}}

    shown = durations.with_durations(main)
    assert shown.__module__ == main.__module__ and shown.__name__ == "main"
    assert shown("http://x") == {
        "call": {"timings": {"submitted": "+0.00 s", "finished": "+2.50 s", "took": "2.50 s"}}
    }


def test_a_ratio_is_claimed_only_where_the_spreads_do_not_overlap(helpers):
    _, timed = helpers
    apart = {
        "step by step": {"seconds": 2.0, "runs_s": [1.9, 2.0, 2.4]},
        "compiled": {"seconds": 1.0, "runs_s": [0.9, 1.0, 1.2]},
    }
    assert timed.verdict(apart) == (
        "step by step: 2.00 s (1.90-2.40), compiled: 1.00 s (0.90-1.20) (median of 3 runs, min-max); "
        "compiled 2.00x as fast"
    )
    overlapping = {
        "step by step": {"seconds": 2.0, "runs_s": [1.0, 2.0, 2.4]},
        "compiled": {"seconds": 1.0, "runs_s": [0.9, 1.0, 1.2]},
    }
    text = timed.verdict(overlapping)
    assert "the ranges overlap: the ratio (2.00x) is within the noise, not a result" in text
    assert "as fast" not in text
