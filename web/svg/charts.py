"""Small charts as SVG: load bars, sparklines, and a session's timeline (Gantt) per engine."""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence

from parrot.platform.serve.ops.observe import DagCall, DisplayState
from parrot.web.svg import Markup, num, text

UNSETTLED = (DisplayState.WAITING, DisplayState.QUEUED, DisplayState.RUNNING)  # still moving


def load_bar(used: float | None, total: float | None, width: int = 140, height: int = 10) -> Markup:
    """A bar filled to ``used / total`` (empty with a dashed outline when unknown)."""
    if not total or used is None:
        return Markup(
            f'<svg class="bar unknown" width="{width}" height="{height}" role="img" aria-label="unknown">'
            f'<rect x="0.5" y="0.5" width="{width - 1}" height="{height - 1}" rx="3"/></svg>'
        )
    frac = max(0.0, min(1.0, used / total))
    level = "high" if frac > 0.85 else "mid" if frac > 0.6 else "low"
    return Markup(
        f'<svg class="bar {level}" width="{width}" height="{height}" role="img" '
        f'aria-label="{text(f"{used:g} of {total:g}")}">'
        f'<rect class="bg" width="{width}" height="{height}" rx="3"/>'
        f'<rect class="fill" width="{num(width * frac)}" height="{height}" rx="3"/></svg>'
    )


LABEL_BAND = 14  # the strip above a sparkline's plot that holds its "max" label


def sparkline(values: Sequence[float], label: str, width: int = 260, height: int = 58) -> Markup:
    """A line of ``values`` (oldest left), scaled to its own maximum, which is written above
    the plot (never over the line)."""
    top = max(values, default=0.0) or 1.0
    n = len(values)
    step = width / max(n - 1, 1)
    plot = height - 2 - LABEL_BAND - 2  # the maximum sits 2 px under the label's strip
    points = " ".join(f"{num(i * step)},{num(height - 2 - (v / top) * plot)}" for i, v in enumerate(values))
    area = f"0,{height} {points} {num((n - 1) * step)},{height}" if n > 1 else ""
    return Markup(
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{text(label)}" preserveAspectRatio="none">'
        + (f'<polygon class="area" points="{area}"/><polyline points="{points}"/>' if n > 1 else "")
        + f'<text x="{width - 2}" y="11" text-anchor="end">max {text(f"{top:.3g}")}</text></svg>'
    )


def _pack(calls: Sequence[DagCall], now: float) -> dict[str, int]:
    """Sub-rows within an engine's lane, so calls that ran at once do not overlap: each call
    takes the free row that came free first (a heap: n log n, and as few rows as calls ever
    overlapped), or a new row."""
    free: list[tuple[float, int]] = []  # (when its last call ended, row), the earliest first
    rows = 0
    row_of = {}
    for call in sorted(calls, key=lambda c: c.timings["submitted_at"]):
        start = call.timings["submitted_at"]
        end = call.timings.get("finished_at", now)
        if free and free[0][0] <= start:
            _, row = heapq.heappop(free)
        else:
            row, rows = rows, rows + 1
        heapq.heappush(free, (end, row))
        row_of[call.call_id] = row
    return row_of


def gantt(calls: Sequence[DagCall], width: int = 720, bar: int = 14) -> Markup:
    """The calls of a session on a time axis, one lane per engine (calls that ran at once
    on separate rows of it): a dashed line while a call waited (submitted → started), a
    bar while it ran (started → finished, or now)."""
    now = time.time()
    runs = [c for c in calls if "submitted_at" in c.timings]
    if not runs:
        return Markup('<p class="muted">No calls yet.</p>')
    t0 = min(c.timings["submitted_at"] for c in runs)
    t1 = max(max(c.timings.values()) for c in runs)
    if any(c.state in UNSETTLED for c in runs):
        t1 = max(t1, now)
    span = max(t1 - t0, 1e-3)
    engines = sorted({c.engine or "(not placed)" for c in runs})
    lanes = {e: [c for c in runs if (c.engine or "(not placed)") == e] for e in engines}
    rows = {e: _pack(lanes[e], now) for e in engines}
    tops, y = {}, 0
    for engine in engines:
        tops[engine] = y
        y += (max(rows[engine].values()) + 1) * bar + 8
    left, height = 110, y + 18
    scale = (width - left - 8) / span

    def x(t: float) -> str:
        return num(left + (t - t0) * scale)

    out = [
        f'<svg class="gantt" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="timeline of the calls per engine">'
    ]
    for engine in engines:
        top = tops[engine]
        bottom = top + (max(rows[engine].values()) + 1) * bar + 8
        out.append(
            f'<text class="lane" x="4" y="{top + bar}">{text(engine, 16)}</text>'
            f'<line class="lane-line" x1="{left}" x2="{width - 4}" y1="{bottom}" y2="{bottom}"/>'
        )
        for call in lanes[engine]:
            y0 = top + 4 + rows[engine][call.call_id] * bar
            start = call.timings.get("started_at")
            end = call.timings.get("finished_at", now)
            submitted = call.timings["submitted_at"]
            out.append(
                f'<line class="wait" x1="{x(submitted)}" x2="{x(start if start else end)}" '
                f'y1="{y0 + bar / 2 - 1}" y2="{y0 + bar / 2 - 1}"/>'
            )
            if start is not None:
                w = max((end - start) * scale, 2)
                tip = f"#{call.seq} {call.state}: {end - start:.2f} s"
                out.append(
                    f'<rect class="run state-{text(call.state)}" x="{x(start)}" y="{y0}" width="{num(w)}" '
                    f'height="{bar - 3}" rx="2"><title>{text(tip)}</title></rect>'
                    f'<text class="bar-label" x="{x(start)}" dx="3" y="{y0 + bar - 5}">#{call.seq}</text>'
                )
    out.append(
        f'<text class="axis" x="{left}" y="{height - 4}">0 s</text>'
        f'<text class="axis" x="{width - 4}" y="{height - 4}" text-anchor="end">{span:.1f} s</text></svg>'
    )
    return Markup("".join(out))
