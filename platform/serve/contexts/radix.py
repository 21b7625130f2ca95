"""A radix tree over token ids (or characters) whose paths are the contexts of one engine.

Every context an engine holds is a path from the root: the tokens it holds, in order.
Nodes split wherever two paths diverge, and each node knows which contexts pass through it
(its ``holders``): any holder of a node holds the node's whole segment, so a prompt that
matches the tree up to position ``m`` can fork from any holder of the node where the match
ends, taking its first ``m`` tokens. Holders of a node always include the holders of its
children, so a node nobody holds has an empty subtree and is pruned.

The tree is generic over its symbols (a tuple of token ids, or a str for engines whose
contexts are text) and over what a holder is.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

H = TypeVar("H", bound=Hashable)
Symbols = Sequence  # tuple[int, ...] | str


def common_prefix(a: Symbols, b: Symbols) -> int:
    """Length of the longest common prefix (slices compare in C: a binary search is fast)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(eq=False)
class RadixNode(Generic[H]):
    segment: Symbols
    parent: RadixNode[H] | None
    depth: int  # symbols on the path before this node's segment
    children: dict = field(default_factory=dict)  # first symbol -> node
    holders: set[H] = field(default_factory=set)

    @property
    def end(self) -> int:
        return self.depth + len(self.segment)

    def path(self) -> Iterator[RadixNode[H]]:
        """This node and its ancestors up to (not including) the root."""
        node: RadixNode[H] | None = self
        while node is not None and node.parent is not None:
            yield node
            node = node.parent


@dataclass(frozen=True)
class Match(Generic[H]):
    length: int  # symbols of the query found in the tree
    node: RadixNode[H] | None  # the node the match ends in (None: nothing matched)


class RadixTree(Generic[H]):
    def __init__(self, empty: Symbols = ()) -> None:
        self.root: RadixNode[H] = RadixNode(empty, None, 0)

    def match(self, symbols: Symbols) -> Match[H]:
        """The longest prefix of ``symbols`` that some path holds."""
        node, i, last = self.root, 0, None
        while i < len(symbols):
            child = node.children.get(symbols[i])
            if child is None:
                break
            step = common_prefix(child.segment, symbols[i : i + len(child.segment)])
            i += step
            last = child
            if step < len(child.segment):
                break
            node = child
        return Match(i, last)

    def insert(self, symbols: Symbols, holder: H, start: RadixNode[H] | None = None) -> RadixNode[H]:
        """Make ``symbols`` (continuing the path of ``start``, default the root) a path held by
        ``holder``; returns the node where it ends (split so that a node ends there)."""
        node = start or self.root
        i = 0
        while i < len(symbols):
            child = node.children.get(symbols[i])
            if child is None:
                child = RadixNode(symbols[i:], node, node.end)
                node.children[symbols[i]] = child
                node = child
                break
            step = common_prefix(child.segment, symbols[i : i + len(child.segment)])
            if step < len(child.segment):
                child = self._split(child, step)
            node, i = child, i + step
        for n in node.path():
            n.holders.add(holder)
        return node

    def release(self, end: RadixNode[H], holder: H) -> None:
        """``holder`` no longer holds the path ending at ``end``; nodes nobody holds go."""
        for node in list(end.path()):
            node.holders.discard(holder)
            if not node.holders and node.parent is not None:
                siblings = node.parent.children
                if siblings.get(node.segment[0]) is node:
                    del siblings[node.segment[0]]

    def _split(self, node: RadixNode[H], at: int) -> RadixNode[H]:
        """Cut ``node`` after ``at`` symbols: a new upper node takes its place; the node object
        stays the lower part, so whatever ends at it still does."""
        parent = node.parent
        upper = RadixNode(node.segment[:at], parent, node.depth, holders=set(node.holders))
        parent.children[node.segment[0]] = upper
        node.segment, node.depth, node.parent = node.segment[at:], node.depth + at, upper
        upper.children[node.segment[0]] = node
        return upper

    def nodes(self) -> Iterator[RadixNode[H]]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def exclusive(self, end: RadixNode[H], holder: H) -> int:
        """Symbols of ``holder``'s path that no other holder shares (freed with it)."""
        return sum(len(n.segment) for n in end.path() if n.holders == {holder})
