"""The causal rule: from the processes' logs (:mod:`tracing.recorder`) to the path of one call.

The logs are merged on their clock (``time.monotonic_ns()``, one for all processes of a
machine), and a socket write is joined to the first read of the other end of its connection
after it (the same two addresses, swapped): a process's message reaches the other process.

The **causal ancestors** of an event ``(unit, t)`` are found backwards: everything its unit
did before ``t``, and, for every edge that reached the unit before ``t``, the ancestors of
the edge's source. (A unit runs in order, its earlier steps leading to its later ones, so
the stretches between its waits need no record of their own: what counts of a unit is all
it did up to a time.) An edge only counts when its source happened before, and nothing
before the window's start counts. Side work (a journal writing a call's later states,
background frees, pings) reaches the answer through no edge, so it is not counted.

The **path** is the project frames on the stacks of the hand-offs among the ancestors of
the terminal event, plus the await chain that the terminal's task step resumed (its
handler's frames, which wait rather than hand on), each row placed where it was first seen.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tracing.handoffs import NAMED_KIND

Unit = tuple[str, int]  # (process, unit id in its log)
Event = tuple[Unit, int]  # (unit, time)


@dataclass(frozen=True, order=True)
class Row:
    process: str
    file: str
    function: str


@dataclass(frozen=True)
class Handoff:
    time: int
    unit: Unit
    kind: str
    rows: tuple[Row, ...]  # the project frames on its stack, outermost first
    connection: str | None  # "local>peer" for socket writes


@dataclass
class Trace:
    """The merged logs: hand-offs in time order and the edges into each unit."""

    handoffs: list[Handoff] = field(default_factory=list)
    incoming: dict[Unit, list[tuple[int, Unit, int]]] = field(default_factory=lambda: defaultdict(list))
    reads: list[tuple[int, Unit, str]] = field(default_factory=list)  # (time, unit, "local>peer")
    resumes: dict[Unit, list[tuple[int, tuple[Row, ...]]]] = field(default_factory=lambda: defaultdict(list))
    units: dict[Unit, str] = field(default_factory=dict)

    def edge(self, source: Event, target: Event) -> None:
        (src_unit, src_t), (dst_unit, dst_t) = source, target
        self.incoming[dst_unit].append((dst_t, src_unit, src_t))


def load(paths: list[Path]) -> Trace:
    trace = Trace()
    for path in paths:
        log = json.loads(path.read_text())
        process = log["process"]
        rows = [Row(process, file, function) for file, function in log["codes"]]
        trace.units.update({(process, int(k)): v for k, v in log["units"].items()})
        for t, unit, kind, stack, connection in log["handoffs"]:
            stack_rows = tuple(rows[i] for i in stack)
            trace.handoffs.append(Handoff(t, (process, unit), kind, stack_rows, connection))
        for src, src_t, dst, dst_t in log["edges"]:
            trace.edge(((process, src), src_t), ((process, dst), dst_t))
        trace.reads += [(t, (process, unit), connection) for t, unit, connection in log["reads"]]
        for t, unit, stack in log["resumes"]:
            trace.resumes[(process, unit)].append((t, tuple(rows[i] for i in stack)))
    trace.handoffs.sort(key=lambda h: h.time)
    trace.reads.sort()
    for resumes in trace.resumes.values():
        resumes.sort()
    _join_sockets(trace)
    return trace


def _join_sockets(trace: Trace) -> None:
    """Each socket write reaches the first read after it on the other end of its connection."""
    reads: dict[str, list[tuple[int, Unit]]] = defaultdict(list)
    for t, unit, connection in trace.reads:
        reads[connection].append((t, unit))
    for h in trace.handoffs:
        if h.kind != "socket write" or h.connection is None:
            continue
        local, peer = h.connection.split(">")
        other_end = reads.get(f"{peer}>{local}", [])
        i = bisect.bisect_right(other_end, (h.time, ("", 1 << 62)))
        if i < len(other_end):
            t, unit = other_end[i]
            trace.edge((h.unit, h.time), (unit, t))


def ancestors(trace: Trace, event: Event, since: int) -> dict[Unit, int]:
    """For each unit among the causal ancestors of ``event``: the latest time of it that
    counts (all it did up to then, from ``since`` on, led to the event)."""
    unit, t = event
    bound = {unit: t}
    todo = [unit]
    while todo:
        unit = todo.pop()
        limit = bound[unit]
        for arrived, source, sent in trace.incoming.get(unit, ()):
            if arrived <= limit and sent >= since and sent > bound.get(source, -1):
                bound[source] = sent
                todo.append(source)
    return bound


@dataclass
class CallPath:
    rows: list[Row]  # in order of first sighting
    first_seen: dict[Row, tuple[int, int, Unit]]  # (time, depth in its stack, unit)
    handoffs: list[Handoff]  # the ancestors of the terminal, in time order
    resumed: tuple[Row, ...] = ()  # the project frames the terminal's task step resumed in

    def counts(self) -> dict[str, tuple[int, int]]:
        """(functions, files) per process, and for all ("total": files counted once)."""
        out = {}
        for process in sorted({r.process for r in self.rows}):
            mine = [r for r in self.rows if r.process == process]
            out[process] = (len(mine), len({r.file for r in mine}))
        out["total"] = (len(self.rows), len({r.file for r in self.rows}))
        return out


def call_path(trace: Trace, since: int, terminal: Handoff) -> CallPath:
    """The path that led to ``terminal``, counting only what happened from ``since`` on."""
    bound = ancestors(trace, (terminal.unit, terminal.time), since)
    reaching = _reaching(trace, bound, since)
    # A named point hands data to a later step of its own unit: it counts when that unit
    # hands the call on after it.
    last_reach = {}
    for h in reaching:
        last_reach[h.unit] = max(h.time, last_reach.get(h.unit, -1))
    hits = [
        h
        for h in trace.handoffs
        if since <= h.time <= bound.get(h.unit, -1)
        and (
            h.unit == terminal.unit
            or h in reaching
            or (h.kind == NAMED_KIND and h.time < last_reach.get(h.unit, -1))
        )
    ]
    seen: dict[Row, tuple[int, int, Unit]] = {}

    def sight(rows: tuple[Row, ...], t: int, unit: Unit) -> None:
        for depth, row in enumerate(rows):
            if row not in seen or (t, depth) < seen[row][:2]:
                seen[row] = (t, depth, unit)

    for h in hits:
        sight(h.rows, h.time, h.unit)
    resumed = [(t, rows) for t, rows in trace.resumes.get(terminal.unit, ()) if since <= t <= terminal.time]
    if resumed:
        sight(resumed[-1][1], resumed[-1][0], terminal.unit)
    rows = sorted(seen, key=lambda row: seen[row][:2])
    return CallPath(rows, seen, hits, resumed[-1][1] if resumed else ())


def _reaching(trace: Trace, bound: dict[Unit, int], since: int) -> set[Handoff]:
    """The hand-offs that reached a unit on the path in time: for every edge followed
    backwards from the terminal, the last hand-off its source made before it. A hand-off
    that reached nobody on the path (a write nobody waits for, an event nobody awaits) was
    side work, even in a unit that also hands the call on."""
    mine: dict[Unit, list[Handoff]] = defaultdict(list)
    for h in trace.handoffs:
        mine[h.unit].append(h)
    found: set[Handoff] = set()
    for unit, limit in bound.items():
        for arrived, source, sent in trace.incoming.get(unit, ()):
            if arrived > limit or sent < since or sent > bound.get(source, -1):
                continue
            made = mine.get(source, [])
            i = bisect.bisect_right([h.time for h in made], sent) - 1
            if i >= 0 and made[i].time >= since:
                found.add(made[i])
    return found


def order_violations(trace: Trace, path: CallPath, table: list[Row], since: int) -> list[str]:
    """Pairs that the table lists in an order the record contradicts: B after A although B
    was first seen causally before A (earlier in A's own unit or stack, or upstream of it).
    Rows first seen in concurrent units may come in either order."""
    found = []
    upstream: dict[Row, dict[Unit, int]] = {}
    rows = [row for row in table if row in path.first_seen]
    for i, a in enumerate(rows):
        t_a, depth_a, unit_a = path.first_seen[a]
        for b in rows[i + 1 :]:
            t_b, depth_b, unit_b = path.first_seen[b]
            if (t_b, depth_b) >= (t_a, depth_a):
                continue  # recorded in the table's order
            if a not in upstream:
                upstream[a] = ancestors(trace, (unit_a, t_a), since)
            if upstream[a].get(unit_b, -1) >= t_b:
                found.append(f"{_name(b)} must come before {_name(a)}")
    return found


def _name(row: Row) -> str:
    return f"{row.process} {row.file}: {row.function}"
