"""A session's DAG as SVG: calls and semantic variables in dependency layers, left to right.

A variable nobody produces is in layer 0; a call is one layer right of its furthest input;
its outputs one layer right of it. Within a layer nodes are ordered by the mean row of
what feeds them (fewer crossings), then by submission order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parrot.platform.serve.ops.observe import SessionDag
from parrot.web.svg import Markup, num, text

COL, ROW = 170.0, 46.0  # layer and row pitch
CALL_W, CALL_H = 132.0, 30.0
VAR_W, VAR_H = 116.0, 24.0
PAD = 12.0
# Where the page is narrower than the DAG (a phone), it shrinks to fit down to this scale,
# its 12 px labels still legible at ~7 px; a wider DAG then scrolls in its box, whose edge
# shadows show that there is more.
MIN_SCALE = 0.6


@dataclass(frozen=True)
class Placed:
    node_id: str
    kind: str  # "call" or "var"
    layer: int
    row: int
    x: float  # centre
    y: float


@dataclass(frozen=True)
class DagLayout:
    nodes: dict[str, Placed]
    width: float
    height: float


def predecessors(dag: SessionDag) -> dict[str, list[str]]:
    """Node id -> the nodes it depends on (a call: its inputs; a variable: its producer)."""
    preds: dict[str, list[str]] = {v.var_id: [] for v in dag.vars}
    for call in dag.calls:
        preds[call.call_id] = []
    for edge in dag.edges:
        preds.setdefault(edge.source, [])
        preds.setdefault(edge.target, []).append(edge.source)
    return preds


def layers(dag: SessionDag) -> dict[str, int]:
    """The layer of every node: its longest path from a node without predecessors."""
    preds = predecessors(dag)
    layer: dict[str, int] = {}
    for start in preds:
        stack = [start]
        while stack:  # iterative depth-first: graphs may be deep
            node = stack[-1]
            if node in layer:
                stack.pop()
                continue
            todo = [p for p in preds[node] if p not in layer]
            if todo:
                stack.extend(todo)
                continue
            layer[node] = 1 + max((layer[p] for p in preds[node]), default=-1)
            stack.pop()
    return layer


def layout(dag: SessionDag) -> DagLayout:
    preds = predecessors(dag)
    layer = layers(dag)
    order = {c.call_id: c.seq for c in dag.calls}
    order.update({v.var_id: i for i, v in enumerate(dag.vars)})
    columns: dict[int, list[str]] = {}
    for node in sorted(layer, key=lambda n: (layer[n], order.get(n, 0))):
        columns.setdefault(layer[node], []).append(node)
    rows: dict[str, float] = {}
    for index in sorted(columns):
        column = columns[index]
        first = {node: i for i, node in enumerate(column)}

        def centre(node: str, first: dict[str, int] = first) -> tuple[float, int]:
            fed = [rows[p] for p in preds[node] if p in rows]
            return (sum(fed) / len(fed) if fed else first[node], order.get(node, 0))

        column.sort(key=centre)
        for row, node in enumerate(column):
            rows[node] = float(row)
    tallest = max((len(c) for c in columns.values()), default=0)
    calls = {c.call_id for c in dag.calls}
    placed = {}
    for index, column in columns.items():
        offset = (tallest - len(column)) / 2
        for row, node in enumerate(column):
            placed[node] = Placed(
                node,
                "call" if node in calls else "var",
                index,
                row,
                PAD + CALL_W / 2 + index * COL,
                PAD + ROW / 2 + (row + offset) * ROW,
            )
    width = PAD * 2 + CALL_W + COL * max(len(columns) - 1, 0)
    return DagLayout(placed, width, PAD * 2 + ROW * max(tallest, 1))


def _edge(a: Placed, b: Placed) -> str:
    x1 = a.x + (CALL_W if a.kind == "call" else VAR_W) / 2
    x2 = b.x - (CALL_W if b.kind == "call" else VAR_W) / 2 - 4
    mid = (x1 + x2) / 2
    return f"M{num(x1)},{num(a.y)} C{num(mid)},{num(a.y)} {num(mid)},{num(b.y)} {num(x2)},{num(b.y)}"


def render(dag: SessionDag, link: Callable[[str], str], selected: str | None = None) -> Markup:
    """The DAG as an ``<svg>``; every node links to ``link(node_id)``."""
    shape = layout(dag)
    out = [
        f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(shape.width)} '
        f'{num(shape.height)}" width="{num(shape.width)}" height="{num(shape.height)}" '
        f'style="min-width: {num(shape.width * MIN_SCALE)}px" role="img" '
        f'aria-label="DAG of session {text(dag.session_id)}">',
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#7b8794"/></marker></defs>',
    ]
    for edge in dag.edges:
        a, b = shape.nodes.get(edge.source), shape.nodes.get(edge.target)
        if a is not None and b is not None:
            out.append(f'<path class="edge" d="{_edge(a, b)}" marker-end="url(#arrow)"/>')
    for var in dag.vars:
        p = shape.nodes[var.var_id]
        sel = " selected" if var.var_id == selected else ""
        kind = var.format.kind if var.format is not None else None  # a typed variable
        tip = f"variable {var.name} ({var.state})" + (f", typed: {kind}" if kind else "")
        typed = " typed" if kind else ""
        fmt = f' data-format="{text(kind)}"' if kind else ""
        out.append(
            f'<a href="{text(link(var.var_id))}"><g class="node var var-{text(var.state)}{sel}{typed}"{fmt} '
            f'data-node="{text(var.var_id)}" data-state="{text(var.state)}"><title>{text(tip)}</title>'
            f'<rect x="{num(p.x - VAR_W / 2)}" y="{num(p.y - VAR_H / 2)}" width="{num(VAR_W)}" '
            f'height="{num(VAR_H)}" rx="{num(VAR_H / 2)}"/>'
            f'<text x="{num(p.x)}" y="{num(p.y + 4)}" text-anchor="middle">{text(var.name, 16)}</text>'
            "</g></a>"
        )
    name_of = {v.var_id: v.name for v in dag.vars}  # one lookup per call: linear in the DAG
    for call in dag.calls:
        p = shape.nodes[call.call_id]
        sel = " selected" if call.call_id == selected else ""
        label = f"#{call.seq} {next((name_of[o] for o in call.outputs if o in name_of), call.kind)}"
        tip = f"call #{call.seq} ({call.state})" + (" · latency-critical" if call.latency_critical else "")
        tip += f" · {call.group}" if call.group else ""
        x0, y0 = p.x - CALL_W / 2, p.y - CALL_H / 2
        group = " grouped" if call.group else ""
        out.append(
            f'<a href="{text(link(call.call_id))}"><g class="node call state-{text(call.state)}{group}{sel}" '
            f'data-node="{text(call.call_id)}" data-state="{text(call.state)}"><title>{text(tip)}</title>'
            f'<rect x="{num(x0)}" y="{num(y0)}" width="{num(CALL_W)}" height="{num(CALL_H)}" rx="5"/>'
            f'<text x="{num(p.x)}" y="{num(p.y + 4)}" text-anchor="middle">{text(label, 18)}</text>'
        )
        if call.latency_critical:
            out.append(
                f'<path class="mark-latency" d="M{num(x0 + CALL_W - 14)},{num(y0 - 5)} l10,0 l-5,9 z">'
                "<title>latency-critical</title></path>"
            )
        if call.group:
            out.append(
                f'<text class="mark-group" x="{num(x0 + 3)}" y="{num(y0 - 3)}">{text(call.group, 20)}</text>'
            )
        out.append("</g></a>")
    out.append("</svg>")
    return Markup("".join(out))
