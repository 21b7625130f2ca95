"""Contexts: token sequences with their KV blocks, forming a tree through forks.

All of this lives on the engine thread; nothing here is locked. A context forked from a
parent shares the parent's full blocks by reference; the parent's partial last block is
copied (copy-on-write at fork time), so no block with several owners is ever written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from parrot.engines.builtin.block_manager import BlockManager, chain_hash
from parrot.engines.protocol.errors import ContextFreedError


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
    busy: bool = False  # a job is running on it
    last_used: int = 0  # engine step of the last use, for idle eviction
    parent_deadline: float | None = None  # monotonic: until when a parent not there yet may come

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed


class ContextPool:
    """Creates, forks, grows and frees contexts over one :class:`BlockManager`."""

    def __init__(self, blocks: BlockManager, kv_cache: torch.Tensor) -> None:
        self.blocks = blocks
        self.block_size = blocks.block_size
        self.kv_cache = kv_cache  # [layers, 2, slots, kv_heads, head_dim]
        self.contexts: dict[int, Context] = {}

    def materialize(self, ctx: Context) -> None:
        """Make the fork (or the root) real: from now on it owns blocks."""
        if ctx.materialized:
            return
        parent = ctx.parent
        if parent is not None:
            if parent.freed:
                raise ContextFreedError(
                    f"parent context {parent.context_id} was freed before context "
                    f"{ctx.context_id} could fork from it"
                )
            length = len(parent.token_ids) if ctx.parent_len is None else ctx.parent_len
            if length > len(parent.token_ids):
                raise ContextFreedError(
                    f"parent context {parent.context_id} has {len(parent.token_ids)} tokens, fewer than "
                    f"the {length} that context {ctx.context_id} forks from"
                )
            self._fork(parent, ctx, length)
        ctx.parent = None
        ctx.materialized = True

    def _fork(self, parent: Context, child: Context, length: int) -> None:
        """The child starts as the parent's first ``length`` tokens: the full blocks among them
        shared by reference, a partial last block copied (blocks are never written by two)."""
        bs = self.block_size
        computed = min(parent.num_computed, length)
        full = computed // bs
        child.token_ids = parent.token_ids[:length] + child.token_ids
        for block in parent.blocks[:full]:
            self.blocks.acquire(block)
        child.blocks = parent.blocks[:full]
        child.block_hashes = parent.block_hashes[:full]
        child.num_computed = full * bs
        partial = computed - full * bs
        if partial:
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
        """Publish newly completed blocks in the prefix cache."""
        bs = self.block_size
        while len(ctx.block_hashes) < ctx.num_computed // bs:
            i = len(ctx.block_hashes)
            previous = ctx.block_hashes[-1] if ctx.block_hashes else None
            h = chain_hash(previous, ctx.token_ids[i * bs : (i + 1) * bs])
            self.blocks.register(ctx.blocks[i], h)
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
        self.contexts.pop(ctx.context_id, None)
        return tokens
