"""The torch attention backend against a dense reference, with and without shared prefixes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.attention.base import PLAIN
from parrot.engines.builtin.attention.window import windowed
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, build_step
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool

HEAD_DIM = 16


def make_pool(block_size: int, kv_heads: int, num_blocks: int = 256) -> ContextPool:
    cache = torch.randn(1, 2, num_blocks * block_size, kv_heads, HEAD_DIM)
    return ContextPool(BlockManager(num_blocks, block_size), cache)


def new_context(pool: ContextPool, cid: int, length: int, parent: Context | None = None) -> Context:
    """A context whose first ``length`` tokens (beyond the parent's) are 'computed' (random KV)."""
    ctx = Context(context_id=cid, parent=parent, parent_id=parent.context_id if parent else None)
    pool.contexts[cid] = ctx
    pool.materialize(ctx)
    ctx.token_ids.extend(range(1000 + cid, 1000 + cid + length))
    assert pool.ensure_blocks(ctx, len(ctx.token_ids))
    ctx.num_computed = len(ctx.token_ids)
    pool.register_full_blocks(ctx)
    return ctx


def reference(
    pool: ContextPool, items: list[StepItem], q, k, v, num_heads: int, window: int | None = None
) -> torch.Tensor:
    """Dense causal attention per sequence over its whole gathered KV (within ``window``)."""
    bs = pool.block_size
    kc, vc = pool.kv_cache[0, 0], pool.kv_cache[0, 1]
    outs, row = [], 0
    for item in items:
        ctx, n = item.context, item.num_tokens
        end = item.start + n
        slots = torch.tensor([ctx.blocks[p // bs] * bs + p % bs for p in range(end)])
        keys, vals = kc[slots].clone(), vc[slots].clone()
        keys[item.start :], vals[item.start :] = k[row : row + n], v[row : row + n]
        mask = torch.arange(end)[None, :] <= torch.arange(item.start, end)[:, None]
        if window is not None:
            mask &= torch.arange(item.start, end)[:, None] - torch.arange(end)[None, :] < window
        o = F.scaled_dot_product_attention(
            q[row : row + n].transpose(0, 1),
            keys.transpose(0, 1),
            vals.transpose(0, 1),
            attn_mask=mask,
            enable_gqa=True,
        )
        outs.append(o.transpose(0, 1))
        row += n
    return torch.cat(outs)


def run_backend(pool, items, q, k, v, num_heads, kv_heads, policy):
    batch = build_step(items, pool.block_size, policy, torch.device("cpu"))
    backend = create_backend("torch", num_heads, kv_heads, HEAD_DIM)
    cache = pool.kv_cache.clone()
    out = backend.forward(q, k, v, cache[0, 0], cache[0, 1], batch.attention)
    return out, batch.attention


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(("num_heads", "kv_heads"), [(4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("parent_len", [37, 48])
@pytest.mark.parametrize("mixed", [True, False], ids=["fills-and-decodes", "decodes-only"])
def test_shared_prefix_equals_plain_and_reference(block_size, num_heads, kv_heads, parent_len, mixed):
    torch.manual_seed(0)
    pool = make_pool(block_size, kv_heads)
    parent = new_context(pool, 1, parent_len)
    children = [new_context(pool, 10 + i, i % 3, parent=parent) for i in range(5)]
    other = new_context(pool, 2, 21)  # an unrelated sequence in the same batch
    grandchild = new_context(pool, 30, 2, parent=children[4])
    items = []
    for i, ctx in enumerate([*children, other, grandchild]):
        n = 5 if mixed and i % 2 else 1  # multi-token fills among the decodes, or decodes only
        ctx.token_ids.extend([7] * n)
        assert pool.ensure_blocks(ctx, len(ctx.token_ids))
        items.append(StepItem(ctx, ctx.num_computed, n, sample=True))
    total = sum(i.num_tokens for i in items)
    q = torch.randn(total, num_heads, HEAD_DIM)
    k = torch.randn(total, kv_heads, HEAD_DIM)
    v = torch.randn(total, kv_heads, HEAD_DIM)

    shared, batch = run_backend(
        pool, items, q, k, v, num_heads, kv_heads, SharedPrefixPolicy(min_prefix_tokens=1, min_saved_tokens=0)
    )
    plain, plain_batch = run_backend(
        pool, items, q, k, v, num_heads, kv_heads, SharedPrefixPolicy(enabled=False)
    )
    ref = reference(pool, items, q, k, v, num_heads)

    assert batch.uses_shared_prefix and not plain_batch.uses_shared_prefix
    group = batch.shared_groups[0]
    assert group.num_seqs == 6  # five children and the grandchild share the parent's full blocks
    assert group.prefix_blocks.numel() == parent_len // block_size
    torch.testing.assert_close(plain, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("window", [3, 8, 20, None])
@pytest.mark.parametrize("shared", [True, False], ids=["shared-prefix", "plain"])
@pytest.mark.parametrize("fills", [True, False], ids=["fills", "decodes-only"])
def test_sliding_window_on_forks_decodes_and_fills(backend, window, shared, fills):
    """A windowed batch: forks of forks (nested shared groups), fills and decodes, some queries
    past the whole shared prefix; equal to dense attention masked to the window. Decodes
    only: the Triton backend's path without a gather of the decode rows (the graphs')."""
    torch.manual_seed(2)
    num_heads, kv_heads, bs = 6, 2, 4
    pool = make_pool(bs, kv_heads)
    root = new_context(pool, 1, 17)
    mids = [new_context(pool, 2 + i, 12, parent=root) for i in range(2)]
    leaves = [new_context(pool, 10 + i, 3 + i, parent=mids[i % 2]) for i in range(4)]
    items = []
    for i, ctx in enumerate([*leaves, mids[0]]):
        n = 6 if i % 2 and fills else 1
        ctx.token_ids.extend([7] * n)
        assert pool.ensure_blocks(ctx, len(ctx.token_ids))
        items.append(StepItem(ctx, ctx.num_computed, n, sample=True))
    total = sum(i.num_tokens for i in items)
    q = torch.randn(total, num_heads, HEAD_DIM)
    k = torch.randn(total, kv_heads, HEAD_DIM)
    v = torch.randn(total, kv_heads, HEAD_DIM)
    policy = SharedPrefixPolicy(min_prefix_tokens=1, min_saved_tokens=0, enabled=shared)
    step = build_step(items, bs, policy, torch.device("cpu"))
    assert step.attention.uses_shared_prefix == shared
    batch = step.attention if window is None else windowed(step.attention, step.positions, window)
    cache = pool.kv_cache.clone()
    out = create_backend(backend, num_heads, kv_heads, HEAD_DIM).forward(
        q, k, v, cache[0, 0], cache[0, 1], batch
    )
    expected = reference(pool, items, q, k, v, num_heads, window)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_two_level_sharing_forms_nested_groups(backend):
    """Children of a child: the grandparent's blocks and the child's own blocks are two groups."""
    torch.manual_seed(1)
    num_heads, kv_heads, bs = 6, 2, 4
    pool = make_pool(bs, kv_heads)
    root = new_context(pool, 1, 17)
    mids = [new_context(pool, 2 + i, 12, parent=root) for i in range(2)]
    leaves = [new_context(pool, 10 + i, 3 + i, parent=mids[i % 2]) for i in range(4)]
    items = []
    for ctx in leaves:
        ctx.token_ids.append(7)
        assert pool.ensure_blocks(ctx, len(ctx.token_ids))
        items.append(StepItem(ctx, ctx.num_computed, 1, sample=True))
    n = len(items)
    q = torch.randn(n, num_heads, HEAD_DIM)
    k = torch.randn(n, kv_heads, HEAD_DIM)
    v = torch.randn(n, kv_heads, HEAD_DIM)
    batch = build_step(
        items, bs, SharedPrefixPolicy(min_prefix_tokens=1, min_saved_tokens=0), torch.device("cpu")
    ).attention
    levels = sorted((g.num_seqs, g.prefix_blocks.numel()) for g in batch.shared_groups)
    # All four leaves share the root's 4 full blocks; each pair shares its mid's next blocks.
    assert levels == [(2, 3), (2, 3), (4, 4)]
    backend_impl = create_backend(backend, num_heads, kv_heads, HEAD_DIM)
    cache = pool.kv_cache.clone()
    out = backend_impl.forward(q, k, v, cache[0, 0], cache[0, 1], batch)
    torch.testing.assert_close(out, reference(pool, items, q, k, v, num_heads), atol=1e-5, rtol=1e-5)


def test_fork_shares_full_blocks_and_copies_partial_block():
    pool = make_pool(4, 2, num_blocks=32)
    parent = new_context(pool, 1, 10)  # two full blocks and a partial one of 2 tokens
    used = pool.blocks.num_used
    child = new_context(pool, 2, 0, parent=parent)
    assert child.blocks[:2] == parent.blocks[:2]
    assert child.blocks[2] != parent.blocks[2]
    assert pool.blocks.num_used == used + 1  # only the copied partial block is new
    bs = 4
    src, dst = parent.blocks[2] * bs, child.blocks[2] * bs
    torch.testing.assert_close(pool.kv_cache[:, :, dst : dst + 2], pool.kv_cache[:, :, src : src + 2])
    assert child.num_computed == 10 and child.token_ids == parent.token_ids
    pool.free(parent)
    assert all(pool.blocks.ref_count(b) == 1 for b in child.blocks)  # the child keeps them alive


def test_a_second_copy_of_cached_blocks_is_dropped_unless_a_fork_holds_it():
    """Two contexts compute the same tokens in one step: when the second's blocks fill up,
    it takes the first's cached blocks and frees its own (its partial last block stays its
    own); a copy that a fork already shares is kept, so the fork's table stays right."""
    pool = make_pool(block_size=4, kv_heads=1, num_blocks=16)
    a, b, c = (Context(context_id=n) for n in (1, 2, 3))
    for ctx in (a, b, c):
        pool.contexts[ctx.context_id] = ctx
        pool.materialize(ctx)
        ctx.token_ids.extend(range(10))  # 2 full blocks and 2 tokens
        assert pool.ensure_blocks(ctx, 10)
    free = pool.blocks.num_free
    pool.computed(a, 10, None)
    pool.computed(b, 10, None)
    assert b.blocks[:2] == a.blocks[:2] and b.blocks[2] != a.blocks[2]
    assert pool.blocks.num_free == free + 2 and pool.blocks.ref_count(a.blocks[0]) == 2
    shared = c.blocks[:2]  # a fork in the step that computes them holds them too
    for block in shared:
        pool.blocks.acquire(block)
    pool.computed(c, 10, None)
    assert c.blocks[:2] == shared != a.blocks[:2]
    assert [pool.blocks.ref_count(block) for block in shared] == [2, 2]


def test_block_manager_prefix_cache_reuses_and_evicts_lru():
    blocks = BlockManager(num_blocks=3, block_size=2)
    a = blocks.allocate()
    blocks.register(a, b"a")
    blocks.release(a)
    assert blocks.num_free == 3 and blocks.num_cached == 1
    assert blocks.lookup(b"a") == a
    blocks.acquire(a)
    assert blocks.num_cached == 0 and blocks.ref_count(a) == 1
    blocks.release(a)
    got = [blocks.allocate() for _ in range(3)]
    assert sorted(got) == [0, 1, 2]  # the cached block was evicted last
    assert blocks.lookup(b"a") is None
    assert blocks.allocate() is None
    blocks.release(got[0])
    with pytest.raises(RuntimeError, match="released more often"):
        blocks.release(got[0])


def test_the_shared_prefix_break_even_is_the_devices_unless_set():
    """Measured by benchmarks/attention_kernels.py: near 3k saved tokens on the CPU, tens of
    thousands on an H200 (docs/benchmarks.md); a value given by the operator is kept."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert SharedPrefixPolicy().for_device(cpu).min_saved_tokens == 3072
    assert SharedPrefixPolicy().for_device(cuda).min_saved_tokens == 98304
    assert SharedPrefixPolicy(min_saved_tokens=10).for_device(cuda).min_saved_tokens == 10


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_a_prompt_chunk_on_the_fused_kernel_equals_the_products_that_give_the_lse(kv_heads, window):
    """A chunk after earlier keys (and a window that narrows the mask): torch's fused kernel,
    used where no merge needs the log-sum-exp, computes what the explicit products compute."""
    torch.manual_seed(0)
    backend = create_backend("torch", 4, kv_heads, HEAD_DIM)
    n, earlier = 7, 12
    q = torch.randn(n, 4, HEAD_DIM)
    k_cache, v_cache = torch.randn(64, kv_heads, HEAD_DIM), torch.randn(64, kv_heads, HEAD_DIM)
    slots = torch.randperm(64)[: earlier + n]  # paged: the keys are not in order in the cache
    qpos, kpos = torch.arange(earlier, earlier + n), torch.arange(earlier + n)
    mask = kpos[None, :] <= qpos[:, None]
    if window is not None:
        mask &= kpos[None, :] > qpos[:, None] - window
    fused, none = backend._prefill(q, k_cache, v_cache, slots, mask, False, PLAIN)
    explicit, lse = backend._prefill(q, k_cache, v_cache, slots, mask, True, PLAIN)
    assert none is None and lse.shape == (n, 4)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_with_its_lse_on_the_cpu_kernel_equals_the_products(dtype):
    """The shared prefix's part (and a prefill beside it) needs the log-sum-exp: on the CPU
    torch's flash kernel gives it; it equals the explicit products, and a query that sees no
    key (slid past the prefix) has lse -inf and no NaN, so a merge gives that part no weight."""
    torch.manual_seed(0)
    backend = create_backend("torch", 6, 2, HEAD_DIM)
    n, length = 5, 40
    q = torch.randn(n, 6, HEAD_DIM).to(dtype)
    keys, vals = torch.randn(2, length, HEAD_DIM).to(dtype), torch.randn(2, length, HEAD_DIM).to(dtype)
    mask = torch.rand(n, length) > 0.4
    mask[3] = False
    out, lse = backend._with_lse(q, keys, vals, mask, PLAIN)
    assert out.dtype == dtype and out.shape == (n, 6, HEAD_DIM) and lse.shape == (n, 6)
    assert torch.isneginf(lse[3]).all() and not out.isnan().any()
    qf = q.float().view(n, 2, 3, HEAD_DIM)  # [n, kvh, g, d]
    scores = torch.einsum("nkgd,kld->nkgl", qf, keys.float()) * HEAD_DIM**-0.5
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    seen = [0, 1, 2, 4]
    expected_lse = torch.logsumexp(scores, -1).reshape(n, 6)
    expected = torch.einsum("nkgl,kld->nkgd", torch.softmax(scores[seen], -1), vals.float()).reshape(4, 6, -1)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(lse[seen], expected_lse[seen], atol=tol, rtol=tol)
    torch.testing.assert_close(out[seen].float(), expected, atol=tol, rtol=tol)
    products, products_lse = backend._with_lse(q, keys, vals, mask, PLAIN, kernel=False)  # a GPU's way
    assert torch.isneginf(products_lse[3]).all() and not products.isnan().any()
    torch.testing.assert_close(products_lse[seen], expected_lse[seen], atol=tol, rtol=tol)
    torch.testing.assert_close(products[seen].float(), expected, atol=tol, rtol=tol)
