"""The contexts the ServeCore holds on one engine, as a radix tree of their tokens.

A task's prompt (token ids, or text for an engine that takes text) forks from the engine
context holding its longest prefix, at the length matched, wherever that falls; only the
rest is sent and computed. Contexts are owned by a session (they hold its data: variable
values, generated text) and freed with it, or shared by every session (a prefix of constant
template text: a system prompt), kept while memory allows and evicted least recently used,
never while a task uses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from parrot.engines.protocol.errors import ParrotError
from parrot.platform.serve.contexts.radix import RadixNode, RadixTree

log = logging.getLogger(__name__)

PENDING, READY = "pending", "ready"


@dataclass(frozen=True)
class MemoryPressure:
    """When the ServeCore frees cached contexts on an engine: above ``high`` of its KV
    blocks in use, down to ``low``."""

    high: float = 0.9
    low: float = 0.75
    # Text contexts (OpenAI engines) kept at most per engine, in characters, before the oldest go.
    text_chars: int = 64 * 2**20

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high <= 1:
            raise ValueError(f"need 0 < low <= high <= 1, got low={self.low} high={self.high}")
        if self.text_chars < 0:
            raise ValueError(f"text_chars must not be negative, got {self.text_chars}")


@dataclass(eq=False)
class EngineContext:
    """One context on an engine. ``owner`` is the session whose data it holds (None: only
    constant text, shared by every session)."""

    context_id: int
    length: int
    owner: str | None
    node: RadixNode | None = None  # where its path ends in the tree (None once gone)
    refs: int = 0  # tasks using it (to fork from, or generating into it)
    state: str = PENDING  # READY once the engine has computed it
    doomed: bool = False  # its session ended while others used it: it goes with its last user
    last_used: float = field(default_factory=time.monotonic)

    def __hash__(self) -> int:
        return self.context_id


@dataclass(frozen=True)
class ForkPoint:
    """Where a prompt starts on an engine: ``length`` symbols of ``parent`` (None: a root)."""

    parent: EngineContext | None
    length: int


class ContextTree:
    """The contexts of one engine (bookkeeping only: the callers talk to the engine). Only
    the context manager (platform/serve/contexts/manager.py) changes it."""

    def __init__(self, ids: Iterator[int], text: bool = False) -> None:
        self.ids = ids
        self.text = text  # symbols are characters (an OpenAI engine), else token ids
        self.tree: RadixTree[EngineContext] = RadixTree("" if text else ())
        self.contexts: dict[int, EngineContext] = {}

    def __len__(self) -> int:
        return len(self.contexts)

    def fork_point(self, symbols: Sequence) -> ForkPoint:
        """The context to fork ``symbols`` from: the longest prefix held, by its best holder
        (computed before still-pending, shared before session-owned, most recent)."""
        match = self.tree.match(symbols)
        if match.node is None or not match.length:
            return ForkPoint(None, 0)
        parent = max(match.node.holders, key=lambda c: (c.state == READY, c.owner is None, c.last_used))
        return ForkPoint(parent, match.length)

    def matched(self, symbols: Sequence) -> int:
        return self.tree.match(symbols).length

    def add(self, symbols: Sequence, owner: str | None) -> EngineContext:
        """A new context holding ``symbols`` (its engine request is about to be sent)."""
        ctx = EngineContext(next(self.ids), len(symbols), owner)
        ctx.node = self.tree.insert(symbols, ctx)
        self.contexts[ctx.context_id] = ctx
        return ctx

    def extend(self, ctx: EngineContext, more: Sequence) -> None:
        """The context grew by ``more`` (what it generated)."""
        if ctx.node is not None and more:
            ctx.node = self.tree.insert(more, ctx, start=ctx.node)
            ctx.length += len(more)

    def shares_at(self, symbols: Sequence) -> bool:
        """Some context shared by every session ends at or beyond ``symbols`` on its path."""
        match = self.tree.match(symbols)
        if match.length < len(symbols) or match.node is None:
            return False
        return any(c.owner is None for c in match.node.holders)

    def remove(self, ctx: EngineContext) -> int:
        """Forget a context; returns the symbols that only it held (what freeing it frees)."""
        if self.contexts.pop(ctx.context_id, None) is None or ctx.node is None:
            return 0
        own = self.tree.exclusive(ctx.node, ctx)
        self.tree.release(ctx.node, ctx)
        ctx.node = None
        return own

    def unref(self, ctx: EngineContext) -> bool:
        """One user less; True when the context must now be freed (it is doomed)."""
        ctx.refs -= 1
        return ctx.refs == 0 and ctx.doomed and ctx.context_id in self.contexts

    def touch(self, ctx: EngineContext) -> None:
        ctx.last_used = time.monotonic()

    def of_session(self, session_id: str) -> list[EngineContext]:
        return [c for c in self.contexts.values() if c.owner == session_id]

    def evictable(self, protected: set[int] = frozenset()) -> list[EngineContext]:
        """Contexts no task uses, least recently used first; leaves (nothing forks from
        them more deeply) before the prefixes they share."""

        def leaf(c: EngineContext) -> bool:
            return c.node is not None and not c.node.children

        idle = [
            c
            for c in self.contexts.values()
            if c.refs == 0 and c.state == READY and c.context_id not in protected
        ]
        return sorted(idle, key=lambda c: (not leaf(c), c.last_used))

    def exclusive(self, ctx: EngineContext) -> int:
        return self.tree.exclusive(ctx.node, ctx) if ctx.node is not None else 0

    def held_symbols(self) -> int:
        """Symbols held on the engine, each shared one counted once."""
        return sum(len(n.segment) for n in self.tree.nodes())

    def problems(self) -> list[str]:
        """What is wrong with the tree's structure (empty when nothing): each context is
        held by every node of its path, which ends at its length; the nodes' holders are
        exactly the contexts known, a node's holders include its children's, and a node
        nobody holds is gone."""
        out: list[str] = []
        known = set(self.contexts.values())
        holders: set[EngineContext] = set()
        for node in self.tree.nodes():
            holders |= node.holders
            if not node.holders:
                out.append(f"a node at depth {node.depth} is held by no context")
            for child in node.children.values():
                if not child.holders <= node.holders:
                    out.append(f"a node at depth {child.end} has holders its parent node lacks")
        for ctx in known:
            if ctx.node is None or ctx.node.end != ctx.length or (ctx.length and ctx not in ctx.node.holders):
                out.append(f"context {ctx.context_id} is not where its path ends in the tree")
        for ctx in holders - known:
            out.append(f"context {ctx.context_id} is in the tree but was freed")
        return out

    def protected_by(self, prompts: Sequence[Sequence]) -> set[int]:
        """Contexts on the paths of these prompts (queued tasks will fork from them)."""
        keep: set[int] = set()
        for symbols in prompts:
            point = self.fork_point(symbols)
            if point.parent is not None:
                keep.add(point.parent.context_id)
        return keep


SERVECORE_CONTEXT_IDS = 1 << 48
ID_REGIONS = 1 << 14  # regions of 2**48 ids each, all below 2**62


def context_ids(start: int | None = None) -> Iterator[int]:
    """Context ids for one ServeCore run, all at or above 2**48, clear of the small ids a
    direct client of an engine picks. Each run counts from its own random region, so the
    contexts a restarted ServeCore creates never collide with those its previous run left
    on an engine."""
    if start is None:
        start = SERVECORE_CONTEXT_IDS * (1 + secrets.randbelow(ID_REGIONS - 1))
    return itertools.count(start)


async def free_on_engine(engine, context_ids: list[int]) -> None:
    """Free contexts on an engine in one request (aborting any job still on them); an
    engine that is gone has freed them already."""
    if not context_ids:
        return
    with contextlib.suppress(ParrotError, asyncio.TimeoutError):
        await engine.abort(context_ids)
