"""The path table of ``docs/architecture.md`` is the path that one real call takes (issue 34).

One semantic call runs through a real ``parrot serve`` and a real ``parrot engine``, each
under the tracer of ``tests/tracing``; the functions that hand control on towards the
answer, in both processes, must be the table's rows, in an order the record allows.
``PARROT_WRITE_PATH_TABLE=1`` rewrites the table from the record instead.
"""

from __future__ import annotations

import json
import os

from conftest import REPO_ROOT
from tracing import causal, handoffs, path_table
from tracing.one_call import PROCESSES, trace_one_call

DOC = REPO_ROOT / "docs" / "architecture.md"


def test_the_path_table_is_the_path_of_one_call(tmp_path, model_cache_dir, capsys):
    handoffs.check_named_points()  # a named hand-off point that went fails here, loudly
    record = trace_one_call(tmp_path, model_cache_dir)
    since = record.since
    path = causal.call_path(record.trace, since, record.terminal)
    counts = path.counts()
    (tmp_path / "call_path.json").write_text(
        json.dumps(
            {
                "value": record.value,
                "startup_s": record.startup_s,
                "call_ms": (record.terminal.time - since) / 1e6,
                "counts": counts,
                "rows": [[r.process, r.file, r.function, path.first_seen[r][0] - since] for r in path.rows],
                "handoffs": [[h.time - since, *h.unit, h.kind, h.connection] for h in path.handoffs],
            },
            indent=1,
        )
    )
    with capsys.disabled():
        print(f"\ncall path: {path_table.totals(path.rows)} (record: {tmp_path / 'call_path.json'})")

    assert {row.process for row in path.rows} == set(PROCESSES), counts
    hit = {(h.rows[-1].file, h.rows[-1].function) for h in path.handoffs if h.kind == handoffs.NAMED_KIND}
    for file, function, *_ in handoffs.NAMED_POINTS:
        assert (file, function) in hit, f"the call never went through {file}: {function}"
    # The GET must have waited for the value (else its handler's wait is not on the path).
    assert path.resumed, "the answer was there before the GET: the record misses the wait for it"
    # Issue 34's bound: a newcomer follows one call through at most 30 functions in 20 files.
    functions, files = counts["total"]
    assert functions <= 30 and files <= 20, f"the path grew: {path_table.totals(path.rows)}"

    text = DOC.read_text()
    if os.environ.get("PARROT_WRITE_PATH_TABLE") == "1":
        DOC.write_text(path_table.write(text, path.rows))
        return
    table = path_table.read(text)
    missing = [r for r in path.rows if r not in table]
    extra = [r for r in table if r not in path.rows]
    assert not missing and not extra, (
        "docs/architecture.md's path table is not the recorded path "
        "(PARROT_WRITE_PATH_TABLE=1 rewrites it):\n"
        + "".join(f"  missing: {r.process} {r.file}: {r.function}\n" for r in missing)
        + "".join(f"  not on the path: {r.process} {r.file}: {r.function}\n" for r in extra)
    )
    violations = causal.order_violations(record.trace, path, table, since)
    assert not violations, "the path table's order contradicts the record:\n" + "\n".join(violations)
