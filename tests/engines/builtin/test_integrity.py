"""The engine's integrity check finds bookkeeping that contradicts itself: a reference
count that is not the number of block tables holding the block, a freed context still in
the pool, a planned length of a context that is gone, a job on a freed context."""

from __future__ import annotations

import asyncio

import pytest
import torch

from parrot.engines.builtin.block_manager import BlockManager, IntegrityError
from parrot.engines.builtin.context_pool import ContextPool, Target


def run_job(pool: ContextPool, target: Target, tokens: list[int]):
    """What the engine does with a fill: plan, admit, compute, settle."""
    ctx = pool.context_for(target)
    pool.plan(ctx, len(tokens))
    pool.admit(ctx, tokens)
    assert pool.ensure_blocks(ctx, len(ctx.token_ids))
    pool.computed(ctx, len(ctx.token_ids), torch.zeros(2))
    pool.settle(ctx)
    return ctx


def pool_with_a_fork() -> tuple[ContextPool, object, object]:
    """A parent of 10 tokens (2 full blocks of 4, 2 tokens in a third) and a fork of it."""
    pool = ContextPool(BlockManager(16, 4), torch.zeros(1, 2, 16 * 4, 1, 2))
    parent = run_job(pool, Target(1), list(range(10)))
    child = run_job(pool, Target(2, parent_id=1), [11, 12])
    pool.check_integrity()
    return pool, parent, child


def test_a_consistent_pool_passes():
    pool, parent, child = pool_with_a_fork()
    assert child.blocks[:2] == parent.blocks[:2]  # shared full blocks, counted twice
    assert pool.blocks.ref_count(parent.blocks[0]) == 2
    pool.free(parent)
    pool.check_integrity()
    pool.free(child)
    pool.check_integrity()
    assert pool.blocks.num_used == 0


def test_the_shared_block_count_follows_forks_and_frees():
    """Kept as references change (the engine publishes it every step): two full blocks
    shared by the fork, none once the fork is the only one left."""
    pool, parent, _fork = pool_with_a_fork()
    assert pool.blocks.num_shared == 2
    grandchild = run_job(pool, Target(3, parent_id=2), [13])
    # the parent's two blocks (three references now) and the fork's own full third block
    assert pool.blocks.num_shared == 3
    pool.free(parent)
    pool.free(grandchild)
    assert pool.blocks.num_shared == 0
    pool.check_integrity()


def test_a_corrupted_reference_count_is_found():
    pool, parent, _ = pool_with_a_fork()
    shared = parent.blocks[0]
    pool.blocks.acquire(shared)  # one reference that no block table holds
    with pytest.raises(IntegrityError, match=f"block {shared} has 3 references but 2 block tables hold it"):
        pool.check_integrity()


def test_a_block_both_free_and_held_is_found():
    pool, parent, _ = pool_with_a_fork()
    pool.blocks.release(parent.blocks[2])  # the parent's partial block goes back, still in its table
    with pytest.raises(IntegrityError, match=f"block {parent.blocks[2]} has 0 references but 1 block tables"):
        pool.check_integrity()


def test_a_freed_context_left_in_the_pool_is_found():
    pool, _, child = pool_with_a_fork()
    pool.free(child)
    pool.contexts[child.context_id] = child
    with pytest.raises(IntegrityError, match="context 2 is freed but in the pool"):
        pool.check_integrity()


def test_a_planned_length_below_the_tokens_is_found():
    pool, parent, _ = pool_with_a_fork()
    pool.plan(parent, 5)
    pool.check_integrity()
    pool.plan(parent, -8)
    with pytest.raises(IntegrityError, match="context 1 is planned at 7 tokens but holds 10"):
        pool.check_integrity()


def test_the_shared_engine_passes_after_work(engine, ids):
    from parrot.wire.sampling import SamplingParams

    async def work() -> None:
        root, child = next(ids), next(ids)
        await engine.fill(root, engine.tokenize("Integrity: every block accounted for. " * 4))
        await engine.generate(child, SamplingParams(max_tokens=3, temperature=0), parent_context_id=root)
        await engine.check_integrity()
        await engine.free_context(root)
        await engine.free_context(child)
        await engine.check_integrity()

    asyncio.run(work())
