"""Contexts: token sequences with their KV blocks, forming a tree through forks.

All of this lives on the engine thread; nothing here is locked. A context forked from a
parent shares the parent's full blocks by reference; the parent's partial last block is
copied (copy-on-write at fork time), so no block with several owners is ever written. The
pool is the one owner of a context's sequence state: it creates and removes contexts,
tracks their planned lengths, appends their tokens and records what a step computed
(:meth:`ContextPool.computed`, from the engine's postprocess step). The local scheduler's
own marks on a context are ``busy`` and ``last_used``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from parrot.engines.builtin.block_manager import BlockManager, IntegrityError, chain_hash
from parrot.engines.protocol.errors import (
    BadRequestError,
    ContextConflictError,
    ContextFreedError,
    ParrotError,
    UnknownContextError,
)


class Target(NamedTuple):
    """The context a job runs on; a new one forks ``parent_id`` (its first ``parent_len``
    tokens, or all of it once it is idle). A parent that does not exist yet is waited for
    up to ``parent_wait_s`` (its request may still be on its way)."""

    context_id: int
    parent_id: int | None = None
    parent_len: int | None = None
    parent_wait_s: float = 0.0


@dataclass(eq=False)
class Context:
    context_id: int
    parent: Context | None = None  # kept only until the fork is made
    parent_id: int | None = None
    # How many of the parent's tokens the fork takes; None: all of them, once the parent is
    # idle (a fork at a given length may start while the parent is still running).
    parent_len: int | None = None
    token_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # of the leading full blocks
    num_computed: int = 0  # tokens whose KV is in ``blocks``
    last_hidden: torch.Tensor | None = None  # [hidden] of the last token, once computed
    materialized: bool = False
    freed: bool = False
    busy: bool = False  # a job is running on it (the local scheduler's mark)
    last_used: int = 0  # engine step of the last use, for idle eviction (the scheduler's mark)
    parent_deadline: float | None = None  # monotonic: until when a parent not there yet may come

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed


def within_fork(ctx: Context, parent: Context) -> bool:
    """``ctx`` forks only tokens that ``parent`` (a fork) takes from its own parent."""
    p, q = ctx.parent_len, parent.parent_len
    return parent.parent is not None and p is not None and q is not None and p <= q


class ContextPool:
    """Creates, forks, grows and frees contexts over one :class:`BlockManager`."""

    def __init__(self, blocks: BlockManager, kv_cache: torch.Tensor) -> None:
        self.blocks = blocks
        self.block_size = blocks.block_size
        self.kv_cache = kv_cache  # [layers, 2, slots, kv_heads, head_dim]
        self.contexts: dict[int, Context] = {}
        self.orphans: dict[int, Context] = {}  # forks waiting for a parent not there yet
        self._planned: dict[int, int] = {}  # context id -> length once its queued jobs ran

    # -- creation, planned lengths, removal ------------------------------------------------
    def context_for(self, target: Target) -> Context:
        """The target's context: the existing one, or a new (not yet made) root or fork."""
        context_id, parent_id, parent_len, parent_wait_s = target
        if parent_len is not None and parent_id is None:
            raise BadRequestError("parent_len needs parent_context_id")
        ctx = self.contexts.get(context_id)
        if ctx is not None:
            if parent_id is not None and (parent_id != ctx.parent_id or parent_len != ctx.parent_len):
                raise ContextConflictError(
                    f"context {context_id} already exists with parent {ctx.parent_id} "
                    f"(length {ctx.parent_len}), not {parent_id} (length {parent_len})"
                )
            return ctx
        parent = None
        if parent_id is not None:
            if parent_id == context_id:
                raise BadRequestError("a context cannot be its own parent")
            parent = self.contexts.get(parent_id)
            if parent is None:
                if parent_wait_s <= 0 or parent_len is None:
                    raise UnknownContextError(f"parent context {parent_id} does not exist")
                return self._orphan(target)
            self._check_fork(parent, parent_len)
        ctx = Context(context_id=context_id, parent=parent, parent_id=parent_id, parent_len=parent_len)
        self.contexts[context_id] = ctx
        if parent is not None:
            self._planned[context_id] = parent_len if parent_len is not None else self.planned(parent)
        else:
            self._planned[context_id] = 0
        return ctx

    def _check_fork(self, parent: Context, parent_len: int | None) -> None:
        if parent_len is not None and parent_len > self.planned(parent):
            raise BadRequestError(
                f"cannot fork {parent_len} tokens of context {parent.context_id}: it holds "
                f"{self.planned(parent)} (with its queued jobs)"
            )

    def _orphan(self, target: Target) -> Context:
        """A fork whose parent is not there yet: it waits (its jobs are not admitted) until
        the parent appears or ``parent_wait_s`` passes."""
        ctx = Context(context_id=target.context_id, parent_id=target.parent_id, parent_len=target.parent_len)
        ctx.parent_deadline = time.monotonic() + target.parent_wait_s
        self.contexts[ctx.context_id] = ctx
        self._planned[ctx.context_id] = target.parent_len
        self.orphans[ctx.context_id] = ctx
        return ctx

    def adopt_orphans(self) -> list[tuple[Context, ParrotError]]:
        """Link waiting forks to parents that arrived; returns those that failed (their
        parent never came, or holds too few tokens), for the caller to fail and free."""
        now = time.monotonic()
        failed = []
        for ctx in list(self.orphans.values()):
            parent = self.contexts.get(ctx.parent_id)
            if parent is not None:
                try:
                    self._check_fork(parent, ctx.parent_len)
                except ParrotError as error:
                    failed.append((ctx, error))
                else:
                    ctx.parent, ctx.parent_deadline = parent, None
            elif now < ctx.parent_deadline:
                continue
            else:
                failed.append((ctx, UnknownContextError(f"parent context {ctx.parent_id} does not exist")))
            del self.orphans[ctx.context_id]
        return failed

    def add_checkpoints(
        self, ctx: Context, wanted: Sequence[tuple[int, int]], prompt_len: int
    ) -> list[Context]:
        """New, not yet made contexts that fork ``ctx`` once its prompt is computed."""
        seen: set[int] = set()
        for context_id, length in wanted:
            if context_id in self.contexts or context_id in seen or context_id == ctx.context_id:
                raise ContextConflictError(f"checkpoint context {context_id} already exists")
            if not 1 <= length <= prompt_len:
                raise BadRequestError(f"checkpoint length {length} is outside the prompt (1..{prompt_len})")
            seen.add(context_id)
        made = []
        for context_id, length in wanted:
            cp = Context(context_id=context_id, parent=ctx, parent_id=ctx.context_id, parent_len=length)
            self.contexts[context_id] = cp
            self._planned[context_id] = length
            made.append(cp)
        return made

    def planned(self, ctx: Context) -> int:
        """The context's length once its queued jobs ran (generations at their max_tokens)."""
        return self._planned.get(ctx.context_id, len(ctx.token_ids))

    def is_planned(self, ctx: Context) -> bool:
        return ctx.context_id in self._planned

    def plan(self, ctx: Context, extra: int) -> None:
        """A job that adds up to ``extra`` tokens is queued on the context."""
        self._planned[ctx.context_id] = self.planned(ctx) + extra

    def settle(self, ctx: Context) -> None:
        """No job is queued on the context any more: its planned length is its length."""
        self._planned.pop(ctx.context_id, None)

    def discard(self, ctx: Context) -> None:
        """Forget a context that was never made (created by a request that failed)."""
        if self.contexts.get(ctx.context_id) is ctx:
            del self.contexts[ctx.context_id]
            self._planned.pop(ctx.context_id, None)
        self.orphans.pop(ctx.context_id, None)

    # -- sequence state ----------------------------------------------------------------------
    def admit(self, ctx: Context, token_ids: Sequence[int], writing: Mapping[int, int] | None = None) -> None:
        """A job starts on its context: make it, append its tokens (``writing``: id(context)
        -> its length once the step being built is computed)."""
        self.materialize(ctx, writing)
        ctx.token_ids.extend(token_ids)

    def append_token(self, ctx: Context, token: int) -> None:
        """A sampled token: computed in a later step."""
        ctx.token_ids.append(token)

    def computed(self, ctx: Context, upto: int, last_hidden: torch.Tensor | None) -> None:
        """A step computed the context's KV up to ``upto`` tokens; ``last_hidden`` [hidden] is
        the hidden state of its last token when the step computed that one. Newly full
        blocks enter the prefix cache."""
        ctx.num_computed = upto
        if last_hidden is not None:
            ctx.last_hidden = last_hidden
        self.register_full_blocks(ctx)

    def materialize(self, ctx: Context, writing: Mapping[int, int] | None = None) -> None:
        """Make the fork (or the root) real: it owns blocks from now on (``writing``: see
        :meth:`admit`). Of a fork not made yet (a checkpoint) it forks what that one takes."""
        if ctx.materialized:
            return
        parent = ctx.parent
        if parent is not None:
            length = ctx.parent_len
            if not parent.materialized and within_fork(ctx, parent):
                parent = parent.parent
            if parent.freed:
                raise ContextFreedError(
                    f"parent context {parent.context_id} was freed before context "
                    f"{ctx.context_id} could fork from it"
                )
            length = len(parent.token_ids) if length is None else length
            if length > len(parent.token_ids):
                raise ContextFreedError(
                    f"parent context {parent.context_id} has {len(parent.token_ids)} tokens, fewer than "
                    f"the {length} that context {ctx.context_id} forks from"
                )
            self._fork(parent, ctx, length, (writing or {}).get(id(parent), 0))
        ctx.parent = None
        ctx.materialized = True

    def _fork(self, parent: Context, child: Context, length: int, writing: int = 0) -> None:
        """The child starts as the parent's first ``length`` tokens: the full blocks among them
        shared by reference, a partial last block copied (blocks are never written by two);
        also those the parent fills in the step the child joins (to ``writing``): each layer
        stores a step's keys before any row attends. The child then computes the last one."""
        bs = self.block_size
        computed = min(parent.num_computed, length)
        full = computed // bs
        if min(writing, length) > computed:
            full = max(full, min(writing, length - 1) // bs)
        child.token_ids = parent.token_ids[:length] + child.token_ids
        for block in parent.blocks[:full]:
            self.blocks.acquire(block)
        child.blocks = parent.blocks[:full]
        child.block_hashes = parent.block_hashes[:full]
        child.num_computed = full * bs
        partial = computed - full * bs
        if partial > 0:
            block = self.blocks.allocate()
            if block is not None:  # copy the parent's partial block; else recompute it later
                self._copy_slots(parent.blocks[full], block, partial)
                child.blocks.append(block)
                child.num_computed += partial
        whole = length == len(parent.token_ids) == parent.num_computed
        if whole and child.num_computed == length:
            child.last_hidden = parent.last_hidden

    def _copy_slots(self, src_block: int, dst_block: int, count: int) -> None:
        bs = self.block_size
        src, dst = src_block * bs, dst_block * bs
        self.kv_cache[:, :, dst : dst + count] = self.kv_cache[:, :, src : src + count]

    def ensure_last_pending(self, ctx: Context) -> bool:
        """A context about to generate needs the hidden state of its last token. When it has
        none (a fork at a length whose last token was computed elsewhere), the last token is
        computed again; a shared block holding it is copied first. False: out of blocks."""
        if ctx.num_pending or ctx.last_hidden is not None or not ctx.num_computed:
            return True
        bs = self.block_size
        pos = ctx.num_computed - 1
        index = pos // bs
        block = ctx.blocks[index]
        if self.blocks.ref_count(block) > 1:
            copy = self.blocks.allocate()
            if copy is None:
                return False
            self._copy_slots(block, copy, pos - index * bs)
            self.blocks.release(block)
            ctx.blocks[index] = copy
        del ctx.block_hashes[index:]  # that block is partial again: unpublished
        ctx.num_computed = pos
        return True

    def reuse_cached_prefix(self, ctx: Context) -> int:
        """Adopt cached full blocks for the context's next uncomputed tokens; returns tokens reused.

        A partly computed last block (a fork's copied tail) is swapped for a cached block
        holding the same tokens and more. The last token is never taken from the cache, so
        its hidden state gets computed.
        """
        bs = self.block_size
        reused = 0
        while len(ctx.block_hashes) == ctx.num_computed // bs:
            start = len(ctx.block_hashes) * bs
            if start + bs >= len(ctx.token_ids):
                break
            previous = ctx.block_hashes[-1] if ctx.block_hashes else None
            h = chain_hash(previous, ctx.token_ids[start : start + bs])
            block = self.blocks.lookup(h)
            if block is None:
                break
            index = start // bs
            self.blocks.acquire(block)
            if index < len(ctx.blocks):  # our own partial copy of that block: use the cached one
                self.blocks.release(ctx.blocks[index])
                ctx.blocks[index] = block
            else:
                ctx.blocks.append(block)
            ctx.block_hashes.append(h)
            reused += start + bs - ctx.num_computed
            ctx.num_computed = start + bs
        return reused

    def ensure_blocks(self, ctx: Context, num_tokens: int) -> bool:
        """Allocate blocks so the context can hold ``num_tokens``; False when out of blocks."""
        while len(ctx.blocks) * self.block_size < num_tokens:
            block = self.blocks.allocate()
            if block is None:
                return False
            ctx.blocks.append(block)
        return True

    def blocks_needed(self, ctx: Context, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(ctx.blocks))

    def register_full_blocks(self, ctx: Context) -> None:
        """Publish newly completed blocks in the prefix cache (or share a cached copy)."""
        bs = self.block_size
        while len(ctx.block_hashes) < ctx.num_computed // bs:
            i = len(ctx.block_hashes)
            previous = ctx.block_hashes[-1] if ctx.block_hashes else None
            h = chain_hash(previous, ctx.token_ids[i * bs : (i + 1) * bs])
            ctx.blocks[i] = self.blocks.register_or_share(ctx.blocks[i], h)
            ctx.block_hashes.append(h)

    def release_kv(self, ctx: Context) -> None:
        """Drop the context's KV (preemption or eviction); its tokens are recomputed later."""
        for block in ctx.blocks:
            self.blocks.release(block)
        ctx.blocks = []
        ctx.block_hashes = []
        ctx.num_computed = 0

    def free(self, ctx: Context) -> int:
        tokens = len(ctx.token_ids)
        self.release_kv(ctx)
        ctx.freed = True
        ctx.last_hidden = None
        self.discard(ctx)
        return tokens

    # -- integrity ---------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise :class:`IntegrityError` unless every block is free or held, each held block's
        reference count is the number of block tables holding it, no freed context is in the
        pool, and planned lengths belong to live contexts and cover their tokens."""
        bs = self.block_size
        problems: list[str] = []
        held: Counter[int] = Counter()
        for context_id, ctx in self.contexts.items():
            name = f"context {context_id}"
            if ctx.context_id != context_id or ctx.freed:
                problems.append(
                    f"{name} is {'freed' if ctx.freed else 'filed under another id'} but in the pool"
                )
            if len(set(ctx.blocks)) != len(ctx.blocks):
                problems.append(f"{name} holds a block twice: {ctx.blocks}")
            if ctx.blocks and not ctx.materialized:
                problems.append(f"{name} holds blocks before it is made")
            if not ctx.num_computed <= min(len(ctx.token_ids), len(ctx.blocks) * bs):
                problems.append(
                    f"{name} has {ctx.num_computed} computed tokens of {len(ctx.token_ids)} "
                    f"in {len(ctx.blocks)} blocks"
                )
            if len(ctx.block_hashes) > ctx.num_computed // bs:
                problems.append(f"{name} publishes {len(ctx.block_hashes)} blocks, more than it computed")
            held.update(ctx.blocks)
        for context_id, length in self._planned.items():
            ctx = self.contexts.get(context_id)
            if ctx is None:
                problems.append(f"planned length of context {context_id}, which is not in the pool")
            elif length < len(ctx.token_ids):
                problems.append(
                    f"context {context_id} is planned at {length} tokens but holds {len(ctx.token_ids)}"
                )
        for context_id, ctx in self.orphans.items():
            if self.contexts.get(context_id) is not ctx or ctx.materialized:
                problems.append(f"waiting fork {context_id} is not an unmade context of the pool")
        problems += self.blocks.integrity_problems(held)
        if problems:
            raise IntegrityError("engine state is inconsistent: " + "; ".join(problems[:20]))
