"""An engine's context tree as SVG: forks left to right, one row per leaf.

A node is a run of tokens some contexts hold; its children are the forks that continue it.
A node several sessions hold (or that is constant text every session shares) is drawn
highlighted: that is prefix sharing at work. Its box says, in words: its tokens and where
they start; the contexts through it and the tasks using them; the tokens and KV blocks of it
and all that follows it (``total``); the sessions holding it.

A wide tree is scaled down to fit its box, to at most :data:`MIN_SCALE` (the text stays
readable); wider than that, its box scrolls.
"""

from __future__ import annotations

from dataclasses import dataclass

from parrot.platform.serve.ops.observe import ContextNode, ContextTreeView
from parrot.web.svg import Markup, num, text
from parrot.web.words import plural

COL, ROW = 198.0, 76.0
BOX_W, BOX_H = 180.0, 66.0
PAD = 10.0
MIN_SCALE = 0.75  # the least a tree is scaled down to fit its box (then it scrolls)


@dataclass(frozen=True)
class TreeSpot:
    level: int  # forks from the root
    row: float  # leaves take rows 0, 1, ...; a parent sits at the middle of its children


def layout(view: ContextTreeView) -> dict[int, TreeSpot]:
    children: dict[int | None, list[int]] = {}
    for node in view.nodes:
        children.setdefault(node.parent, []).append(node.node_id)
    level: dict[int, int] = {}
    for node in view.nodes:  # depth-first order: a parent comes before its children
        level[node.node_id] = 0 if node.parent is None else level[node.parent] + 1
    leaves = [n.node_id for n in view.nodes if n.node_id not in children]  # depth-first order
    rows = {node_id: float(i) for i, node_id in enumerate(leaves)}
    for node in reversed(view.nodes):  # children before their parents
        kids = children.get(node.node_id)
        if kids:
            rows[node.node_id] = (rows[kids[0]] + rows[kids[-1]]) / 2
    return {n.node_id: TreeSpot(level[n.node_id], rows[n.node_id]) for n in view.nodes}


def _holders(node: ContextNode, limit: int = 3) -> str:
    names = [s[:6] for s in node.sessions[:limit]]
    more = len(node.sessions) - limit
    label = ", ".join(names) + (f" +{more}" if more > 0 else "")
    if node.shared and not node.sessions:
        return "shared (constant text)"
    return label or "—"


def render(view: ContextTreeView) -> Markup:
    spots = layout(view)
    unit = "character" if view.text else "token"
    levels = max((s.level for s in spots.values()), default=0)
    rows = max((s.row for s in spots.values()), default=0.0)
    width = PAD * 2 + BOX_W + COL * levels
    height = PAD * 2 + ROW * (rows + 1)
    out = [
        f'<svg class="ctx-tree" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(width)} {num(height)}" '
        f'width="{num(width)}" height="{num(height)}" style="min-width: {num(width * MIN_SCALE)}px" '
        f'role="img" '
        f'aria-label="context tree of {text(view.engine_id)}">'
    ]

    def corner(node_id: int) -> tuple[float, float]:
        spot = spots[node_id]
        return PAD + spot.level * COL, PAD + spot.row * ROW

    for node in view.nodes:
        if node.parent is not None:
            (px, py), (x, y) = corner(node.parent), corner(node.node_id)
            out.append(
                f'<path class="edge" d="M{num(px + BOX_W)},{num(py + BOX_H / 2)} '
                f'L{num(x)},{num(y + BOX_H / 2)}"/>'
            )
    for node in view.nodes:
        x, y = corner(node.node_id)
        shared = " shared" if node.shared else ""
        blocks = f" · {plural(node.kv_blocks, 'block')}" if node.kv_blocks is not None else ""
        own = f"{plural(node.tokens, unit)} from {node.start}"
        users = f"{plural(node.contexts, 'context')} · {plural(node.refs, 'task')}"
        total = f"total {plural(node.subtree_tokens, unit)}{blocks}"
        tip = (
            f"{plural(node.tokens, unit)} from position {node.start}; {plural(node.contexts, 'context')} "
            f"through it, used by {plural(node.refs, 'task')} now; with all that follows it "
            f"{plural(node.subtree_tokens, unit)}{blocks.replace('block', 'KV block')}; "
            f"sessions: {', '.join(node.sessions) or 'none'}"
        )
        out.append(
            f'<g class="ctx-node{shared}" data-sessions="{text(" ".join(node.sessions))}" '
            f'data-contexts="{node.contexts}"><title>{text(tip)}</title>'
            f'<rect x="{num(x)}" y="{num(y)}" width="{num(BOX_W)}" height="{num(BOX_H)}" rx="5"/>'
            f'<text x="{num(x + 6)}" y="{num(y + 15)}" class="strong">{text(own, 30)}</text>'
            f'<text x="{num(x + 6)}" y="{num(y + 30)}">{text(users, 30)}</text>'
            f'<text x="{num(x + 6)}" y="{num(y + 45)}" class="total">{text(total, 30)}</text>'
            f'<text x="{num(x + 6)}" y="{num(y + 60)}">{text(_holders(node), 30)}</text></g>'
        )
    out.append("</svg>")
    return Markup("".join(out))
