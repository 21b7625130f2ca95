"""The tracer's rule on a small program (``sample_flow``), independently of Parrot: the
functions that hand the value on are the path, in order; a leaf helper, a side branch, a
task running beside it and what a thread does after handing on are not."""

from __future__ import annotations

import asyncio
from pathlib import Path
from time import monotonic_ns

import pytest

from tracing import causal, handoffs, path_table, sample_flow
from tracing.causal import Row
from tracing.recorder import Recorder

HERE = Path(__file__).parent
SAMPLE = sample_flow.__file__


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> tuple[causal.Trace, causal.CallPath, int]:
    recorder = Recorder(HERE, lambda filename: filename == SAMPLE)
    recorder.install()
    try:
        since = monotonic_ns()
        recorder.active = True
        assert asyncio.run(sample_flow.main()) == "43"
    finally:
        recorder.uninstall()
    log = tmp_path_factory.mktemp("trace") / "sample.json"
    recorder.dump(log, "sample")
    trace = causal.load([log])
    writes = [h for h in trace.handoffs if h.kind == "socket write" and h.connection]
    terminal = writes[-1]
    assert terminal.rows[-1].function == "relay"
    return trace, causal.call_path(trace, since, terminal), since


def names(rows: list[Row]) -> list[str]:
    return [row.function for row in rows]


def test_the_path_is_the_functions_that_handed_the_value_on(traced):
    _, path, _ = traced
    assert names(path.rows) == ["main", "produce", "relay", "worker"]
    assert {row.file for row in path.rows} == {"sample_flow.py"}
    assert names(path.resumed) == ["relay"]  # the terminal's step resumed relay's await


def test_side_work_and_leaves_are_recorded_but_not_on_the_path(traced):
    trace, path, _ = traced
    on_stacks = {row.function for h in trace.handoffs for row in h.rows}
    # side, tick and after_work did hand things on (sets, puts), just not towards the answer
    assert {"side", "tick", "after_work"} <= on_stacks
    assert "helper" not in on_stacks  # it returned before any hand-off
    assert not {"side", "tick", "after_work", "helper"} & set(names(path.rows))


def test_the_order_check_accepts_concurrent_rows_in_either_order_only(traced):
    trace, path, since = traced
    assert causal.order_violations(trace, path, path.rows, since) == []
    row = {row.function: row for row in path.rows}
    # relay starts beside produce (gather): either may be listed first
    concurrent = [row[n] for n in ("main", "relay", "produce", "worker")]
    assert causal.order_violations(trace, path, concurrent, since) == []
    # but main started produce, and relay handed the value to the worker
    contradicting = [row[n] for n in ("produce", "main", "worker", "relay")]
    assert causal.order_violations(trace, path, contradicting, since) == [
        "sample sample_flow.py: main must come before sample sample_flow.py: produce",
        "sample sample_flow.py: relay must come before sample sample_flow.py: worker",
    ]


def test_the_table_reads_back_what_was_written():
    rows = [Row("engine", "a.py", "f"), Row("ServeCore", "b.py", "C.g"), Row("ServeCore", "a.py", "h")]
    text = f"# Doc\n\nprose\n\n{path_table.START}\nold\n{path_table.END}\n\nmore prose\n"
    written = path_table.write(text, rows)
    assert path_table.read(written) == rows
    assert written.startswith("# Doc\n\nprose\n\n") and written.endswith("\n\nmore prose\n")
    per_process = "(ServeCore: 2 functions in 2 files; engine: 1 functions in 1 files)"
    assert f"3 functions in 2 files {per_process}." in written
    with pytest.raises(ValueError, match="totals line"):
        path_table.read(written.replace("3 functions in 2 files", "2 functions in 2 files"))


def test_a_named_hand_off_point_that_went_fails_loudly(monkeypatch):
    handoffs.check_named_points()
    gone = ("engines/builtin/jobs.py", "Outbox.hand_over", "parrot.engines.builtin.jobs", "renamed")
    monkeypatch.setattr(handoffs, "NAMED_POINTS", (*handoffs.NAMED_POINTS, gone))
    with pytest.raises(LookupError, match=r"Outbox\.hand_over no longer exists"):
        handoffs.check_named_points()
