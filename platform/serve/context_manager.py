"""Contexts on engines, as a prefix tree per engine.

A task's prompt is a list of fill pieces (constant text, input variable values, earlier
outputs). Each piece filled on an engine is a context forked from the context of the
pieces before it, so any later prompt that starts with the same pieces forks from the
longest cached prefix instead of filling it again: a system prompt shared by many
sessions is held once per engine. Contexts are reference counted while tasks use them,
freed with their session (session-scoped pieces) and evicted least recently used when
the engine needs room, never while in use.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from parrot.platform.serve.engine_client import Engine
from parrot.platform.serve.tokenizer_manager import Tokenize


@dataclass(frozen=True)
class Piece:
    """One fill of a prompt. ``key`` identifies its content in the prefix tree."""

    key: tuple
    text: str
    session_id: str | None = None  # None: shareable across sessions (constant text)

    @classmethod
    def constant(cls, text: str) -> Piece:
        return cls(("text", text), text)

    @classmethod
    def variable(cls, var_id: str, value: str, session_id: str) -> Piece:
        return cls(("var", var_id), value, session_id)


def group_key(pieces: Sequence[Piece]) -> tuple:
    """The key of a context that holds several pieces."""
    return ("group", *(p.key for p in pieces))


@dataclass(frozen=True)
class MemoryPressure:
    """When the ServeCore frees cached contexts on an engine: above ``high`` of its KV
    blocks in use, down to ``low``."""

    high: float = 0.9
    low: float = 0.75

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high <= 1:
            raise ValueError(f"need 0 < low <= high <= 1, got low={self.low} high={self.high}")


@dataclass(eq=False)
class EngineContext:
    context_id: int
    key: tuple
    parent: EngineContext | None
    session_id: str | None
    children: dict[tuple, EngineContext] = field(default_factory=dict)
    refs: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # Set once the engine has filled it. A node is in the tree while its fill is in flight,
    # so concurrent prompts with the same prefix wait for that fill instead of repeating it.
    filled: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None  # why its fill failed (it left the tree then)

    async def wait_filled(self) -> None:
        await self.filled.wait()
        if self.error is not None:
            raise self.error

    def path(self) -> Iterator[EngineContext]:
        node: EngineContext | None = self
        while node is not None:
            yield node
            node = node.parent


class ContextTree:
    """The contexts of one engine."""

    def __init__(self, engine: Engine, ids: Iterator[int], tokenize: Tokenize | None = None) -> None:
        self.engine = engine
        self.ids = ids
        self.tokenize = tokenize  # None: the engine takes text (an OpenAI engine)
        self.roots: dict[tuple, EngineContext] = {}

    def match(self, pieces: Sequence[Piece]) -> tuple[EngineContext | None, int]:
        """The deepest cached context for a prefix of ``pieces`` and how many pieces it covers."""
        level, node, depth = self.roots, None, 0
        while depth < len(pieces):
            child, step = level.get(pieces[depth].key), 1
            if child is None:  # a context that holds several pieces, the longest first
                for end in range(len(pieces), depth + 1, -1):
                    child = level.get(group_key(pieces[depth:end]))
                    if child is not None:
                        step = end - depth
                        break
            if child is None:
                break
            node, level, depth = child, child.children, depth + step
        return node, depth

    @staticmethod
    def groups(pieces: Sequence[Piece], after: EngineContext | None) -> list[Sequence[Piece]]:
        """How the pieces not yet cached become contexts. Constant pieces that follow only
        constant ones (a system prompt) get a context each: any session may share them.
        From the first piece of a session on, nothing can be shared across sessions, so
        the rest is one context, filled in one engine step instead of one step a piece."""
        out: list[Sequence[Piece]] = []
        shareable = after is None or after.session_id is None
        for n, piece in enumerate(pieces):
            if shareable and piece.session_id is None:
                out.append([piece])
            else:
                out.append(pieces[n:])
                break
        return out

    async def acquire(self, pieces: Sequence[Piece]) -> EngineContext:
        """A context holding exactly ``pieces``: forked from the longest cached prefix, the
        rest filled. The returned context (and its ancestors) are held until ``release``."""
        if not pieces:
            raise ValueError("a prompt needs at least one piece")
        node, depth = self.match(pieces)
        # Hold the matched path first, so nothing evicts it while the rest is filled.
        for n in node.path() if node is not None else ():
            n.refs += 1
        held = node
        try:
            for n in reversed(list(node.path()) if node is not None else []):
                await n.wait_filled()  # filled by a concurrent prompt with the same prefix
            for group in self.groups(pieces[depth:], node):
                key = group[0].key if len(group) == 1 else group_key(group)
                session = next((p.session_id for p in group if p.session_id is not None), None)
                if held is not None and held.session_id is not None:
                    session = held.session_id
                child = EngineContext(next(self.ids), key, held, session, refs=1)
                siblings = held.children if held is not None else self.roots
                siblings[key] = child
                held = child
                await self._fill(child, group)
        except BaseException:
            if held is not None:
                self.release(held)
            raise
        now = time.monotonic()
        for n in held.path():
            n.last_used = now
        return held

    async def _fill(self, node: EngineContext, group: Sequence[Piece]) -> None:
        parent_id = node.parent.context_id if node.parent is not None else None
        try:
            if self.tokenize is None:
                text = "".join(p.text for p in group)
                await self.engine.fill(node.context_id, text=text, parent_context_id=parent_id)
            else:
                # Each piece tokenized on its own (cached), as when it is a context of its own.
                parts = await asyncio.gather(*(self.tokenize(p.text) for p in group))
                tokens = [t for part in parts for t in part]
                await self.engine.fill(node.context_id, token_ids=tokens, parent_context_id=parent_id)
        except BaseException as error:
            siblings = node.parent.children if node.parent is not None else self.roots
            if siblings.get(node.key) is node:
                del siblings[node.key]
            node.error = error
            raise
        finally:
            node.filled.set()

    def release(self, node: EngineContext) -> None:
        for n in node.path():
            n.refs -= 1

    async def free_session(self, session_id: str) -> int:
        """Free every context that holds pieces of ``session_id`` (with their subtrees)."""
        doomed = [
            n
            for n in self._all()
            if n.session_id == session_id and (n.parent is None or n.parent.session_id != session_id)
        ]
        freed = 0
        for node in doomed:
            freed += await self.free_subtree(node)
        return freed

    async def evict(self, max_contexts: int) -> int:
        """Free unused leaves, least recently used first, until at most ``max_contexts`` remain."""
        freed = 0
        while len(list(self._all())) > max_contexts:
            leaves = [n for n in self._all() if not n.children and n.refs == 0]
            if not leaves:
                break
            freed += await self.free_subtree(min(leaves, key=lambda n: n.last_used))
        return freed

    async def relieve(
        self, info: dict, pressure: MemoryPressure, keep: Sequence[Sequence[Piece]] = ()
    ) -> int:
        """Under memory pressure (the engine's ``ping`` shows KV usage above
        ``pressure.high``), free unused leaves least recently used first until the usage
        estimate is down to ``pressure.low``. Contexts in use, and those on the path of a
        prompt in ``keep`` (queued tasks' pieces), are never freed. Returns how many went."""
        total, used, block = info.get("kv_blocks_total"), info.get("kv_blocks_used"), info.get("block_size")
        if not total or not block or used is None or used <= pressure.high * total:
            return 0
        protected = set()
        for pieces in keep:
            node = self.match(pieces)[0]
            protected.update(id(n) for n in (node.path() if node is not None else ()))
        to_free, evicted = used - pressure.low * total, 0
        while to_free > 0:
            leaves = [n for n in self._all() if not n.children and n.refs == 0 and id(n) not in protected]
            if not leaves:
                break
            tokens = await self._free_leaf(min(leaves, key=lambda n: n.last_used))
            to_free -= -(-tokens // block)  # blocks it held (its own, unshared)
            evicted += 1
        return evicted

    async def _free_leaf(self, node: EngineContext) -> int:
        freed = await self.engine.free_context(node.context_id)
        siblings = node.parent.children if node.parent is not None else self.roots
        siblings.pop(node.key, None)
        return freed

    async def free_subtree(self, node: EngineContext) -> int:
        count = 0
        for child in list(node.children.values()):
            count += await self.free_subtree(child)
        if node.refs > 0:
            return count  # in use: kept (its session is going away; freed when released)
        await self._free_leaf(node)
        return count + 1

    def _all(self) -> Iterator[EngineContext]:
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def __len__(self) -> int:
        return sum(1 for _ in self._all())


SERVECORE_CONTEXT_IDS = 1 << 48
ID_REGIONS = 1 << 14  # regions of 2**48 ids each, all below 2**62


def context_ids(start: int | None = None) -> Iterator[int]:
    """Context ids for one ServeCore run, all at or above 2**48, clear of the small ids a
    direct client of an engine picks. Each run counts from its own random region, so the
    contexts a restarted ServeCore creates never collide with those its previous run left
    on an engine (they are evicted there like any idle context)."""
    if start is None:
        start = SERVECORE_CONTEXT_IDS * (1 + secrets.randbelow(ID_REGIONS - 1))
    return itertools.count(start)
