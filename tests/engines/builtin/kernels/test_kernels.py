"""Every Triton kernel against a plain torch reference (interpreted on the CPU, small shapes)."""

from __future__ import annotations

import pytest
import torch

from parrot.engines.builtin.kernels.checks import KernelInputError
from parrot.engines.builtin.kernels.merge import merge_into
from parrot.engines.builtin.kernels.paged_decode import paged_decode_attention
from parrot.engines.builtin.kernels.paged_prefill import paged_prefill_attention, paged_prefill_batch
from parrot.engines.builtin.kernels.shared_prefix import shared_prefix_attention
from parrot.engines.builtin.kernels.store_kv import store_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.float16, torch.bfloat16] if DEVICE == "cuda" else [])
HEAD_DIM = 16
NUM_BLOCKS = 64


def tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def make_cache(kv_heads, block_size, dtype):
    shape = (NUM_BLOCKS * block_size, kv_heads, HEAD_DIM)
    return torch.randn(shape, dtype=dtype, device=DEVICE), torch.randn(shape, dtype=dtype, device=DEVICE)


def random_table(num_blocks, generator):
    return torch.randperm(NUM_BLOCKS, generator=generator)[:num_blocks].to(DEVICE)


def gather(cache, table, length, block_size):
    pos = torch.arange(length, device=DEVICE)
    return cache[table[pos // block_size] * block_size + pos % block_size]  # [length, kvh, d]


def reference(q, keys, vals, mask=None):
    """q [n, H, d], keys/vals [L, kvh, d], mask [n, L] -> out [n, H, d], lse [n, H] (float32)."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, d]
    v = vals.float().repeat_interleave(group, dim=1).transpose(0, 1)
    s = torch.matmul(q.float().transpose(0, 1), k.transpose(1, 2)) * HEAD_DIM**-0.5  # [H, n, L]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.matmul(torch.softmax(s, dim=-1), v)
    return out.transpose(0, 1), lse.transpose(0, 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv(dtype):
    k_cache, v_cache = make_cache(2, 4, dtype)
    k = torch.randn(5, 2, HEAD_DIM, dtype=dtype, device=DEVICE)
    v = torch.randn(5, 2, HEAD_DIM, dtype=dtype, device=DEVICE)
    slots = torch.tensor([3, 17, 0, 255, 42], device=DEVICE)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k[slots], expected_v[slots] = k, v
    store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "kv_heads"), [(2, 2), (3, 1), (8, 1)])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(("block_size", "lengths"), [(4, [1, 9, 16]), (16, [16, 33, 7])])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_decode(dtype, num_heads, kv_heads, batch, block_size, lengths, num_splits):
    g = torch.Generator().manual_seed(batch * 7 + num_heads)
    k_cache, v_cache = make_cache(kv_heads, block_size, dtype)
    lens = (lengths * batch)[:batch]
    max_blocks = max(-(-n // block_size) for n in lens)
    tables = torch.stack([random_table(max_blocks, g) for _ in lens])
    q = torch.randn(batch, num_heads, HEAD_DIM, dtype=dtype, device=DEVICE)
    out, lse = paged_decode_attention(
        q, k_cache, v_cache, tables, torch.tensor(lens, device=DEVICE), block_size, HEAD_DIM**-0.5, num_splits
    )
    for i, n in enumerate(lens):
        ref_out, ref_lse = reference(
            q[i : i + 1], gather(k_cache, tables[i], n, block_size), gather(v_cache, tables[i], n, block_size)
        )
        torch.testing.assert_close(out[i].float(), ref_out[0], **tol(dtype))
        torch.testing.assert_close(lse[i], ref_lse[0], **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "kv_heads"), [(2, 2), (3, 1), (8, 1)])
@pytest.mark.parametrize(
    ("block_size", "kv_start", "cached", "new"), [(4, 0, 0, 7), (4, 8, 5, 11), (16, 16, 21, 20)]
)
def test_paged_prefill_causal_over_cached_prefix(
    dtype, num_heads, kv_heads, block_size, kv_start, cached, new
):
    g = torch.Generator().manual_seed(cached + new)
    k_cache, v_cache = make_cache(kv_heads, block_size, dtype)
    end = kv_start + cached + new
    table = random_table(-(-end // block_size), g)
    q = torch.randn(new, num_heads, HEAD_DIM, dtype=dtype, device=DEVICE)
    q_start = end - new
    sub_table = table[kv_start // block_size :]
    out, lse = paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        sub_table.contiguous(),
        q_start,
        kv_start,
        end - kv_start,
        block_size,
        HEAD_DIM**-0.5,
    )
    keys = gather(k_cache, table, end, block_size)[kv_start:]
    vals = gather(v_cache, table, end, block_size)[kv_start:]
    mask = (
        torch.arange(kv_start, end, device=DEVICE)[None, :]
        <= torch.arange(q_start, end, device=DEVICE)[:, None]
    )
    ref_out, ref_lse = reference(q, keys, vals, mask)
    torch.testing.assert_close(out.float(), ref_out, **tol(dtype))
    torch.testing.assert_close(lse, ref_lse, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "kv_heads"), [(2, 2), (3, 1), (8, 1)])
@pytest.mark.parametrize(("num_tokens", "prefix_blocks"), [(1, 1), (5, 3), (19, 4)])
def test_shared_prefix_and_merge_equal_whole_attention(dtype, num_heads, kv_heads, num_tokens, prefix_blocks):
    """Prefix part + suffix part merged by LSE == attention over the whole sequence."""
    block_size = 4
    g = torch.Generator().manual_seed(num_tokens)
    k_cache, v_cache = make_cache(kv_heads, block_size, dtype)
    prefix = random_table(prefix_blocks, g)
    q = torch.randn(num_tokens, num_heads, HEAD_DIM, dtype=dtype, device=DEVICE)
    p_out, p_lse = shared_prefix_attention(q, k_cache, v_cache, prefix, block_size, HEAD_DIM**-0.5)
    keys = gather(k_cache, prefix, prefix_blocks * block_size, block_size)
    vals = gather(v_cache, prefix, prefix_blocks * block_size, block_size)
    ref_out, ref_lse = reference(q, keys, vals)
    torch.testing.assert_close(p_out, ref_out, **tol(dtype))
    torch.testing.assert_close(p_lse, ref_lse, **tol(dtype))
    # Merge with a separate 'suffix' result for a subset of rows, in place.
    suffix_k = torch.randn(6, kv_heads, HEAD_DIM, dtype=dtype, device=DEVICE)
    suffix_v = torch.randn(6, kv_heads, HEAD_DIM, dtype=dtype, device=DEVICE)
    s_out, s_lse = reference(q, suffix_k, suffix_v)
    out, lse = s_out.clone().contiguous(), s_lse.clone().contiguous()
    rows = torch.arange(num_tokens, device=DEVICE)
    merge_into(out, lse, rows, p_out, p_lse)
    whole_out, whole_lse = reference(q, torch.cat([keys, suffix_k]), torch.cat([vals, suffix_v]))
    torch.testing.assert_close(out, whole_out, **tol(dtype))
    torch.testing.assert_close(lse, whole_lse, **tol(dtype))


def test_two_level_sharing_by_repeated_merging():
    """A grandchild: grandparent prefix, then parent's own blocks, then its suffix."""
    block_size, kvh, heads = 4, 1, 3
    k_cache, v_cache = make_cache(kvh, block_size, torch.float32)
    g = torch.Generator().manual_seed(5)
    blocks = random_table(5, g)
    q = torch.randn(4, heads, HEAD_DIM, device=DEVICE)
    levels = [blocks[:2], blocks[2:4], blocks[4:]]
    out, lse = shared_prefix_attention(
        q, k_cache, v_cache, levels[0].contiguous(), block_size, HEAD_DIM**-0.5
    )
    for level in levels[1:]:
        part = shared_prefix_attention(q, k_cache, v_cache, level.contiguous(), block_size, HEAD_DIM**-0.5)
        merge_into(out, lse, torch.arange(4, device=DEVICE), *part)
    ref_out, ref_lse = reference(
        q, gather(k_cache, blocks, 20, block_size), gather(v_cache, blocks, 20, block_size)
    )
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


# -- long sequences: key tiles over several blocks, splits, windows ------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 2, 5])
@pytest.mark.parametrize("window", [None, 1, 5, 40, 70, 200])
@pytest.mark.parametrize(("block_size", "lens"), [(4, [1, 9, 33]), (16, [130, 300, 77, 1])])
def test_paged_decode_over_many_tiles(dtype, num_splits, window, block_size, lens):
    """Lengths that end mid-tile and mid-block, splits that start mid-sequence, a sliding
    window that skips whole blocks, tiles and splits (only the last ``window`` keys)."""
    g = torch.Generator().manual_seed(num_splits)
    k_cache, v_cache = make_cache(3, block_size, dtype)
    tables = torch.stack([random_table(-(-max(lens) // block_size), g) for _ in lens])
    q = torch.randn(len(lens), 6, HEAD_DIM, dtype=dtype, device=DEVICE)
    out, lse = paged_decode_attention(
        q,
        k_cache,
        v_cache,
        tables,
        torch.tensor(lens, device=DEVICE),
        block_size,
        HEAD_DIM**-0.5,
        num_splits,
        window,
    )
    for i, n in enumerate(lens):
        mask = None if window is None else (torch.arange(n, device=DEVICE) >= n - window)[None, :]
        keys, vals = gather(k_cache, tables[i], n, block_size), gather(v_cache, tables[i], n, block_size)
        ref_out, ref_lse = reference(q[i : i + 1], keys, vals, mask)
        torch.testing.assert_close(out[i].float(), ref_out[0], **tol(dtype))
        torch.testing.assert_close(lse[i], ref_lse[0], **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 1, 37, 100])
@pytest.mark.parametrize(("kv_start", "cached", "new"), [(0, 0, 150), (32, 100, 90), (16, 5, 3)])
def test_paged_prefill_over_many_tiles(dtype, window, kv_start, cached, new):
    """Several query tiles and key tiles; the diagonal inside a tile and across tiles."""
    block_size = 16
    g = torch.Generator().manual_seed(cached + new)
    k_cache, v_cache = make_cache(2, block_size, dtype)
    end = kv_start + cached + new
    table = random_table(-(-end // block_size), g)
    q = torch.randn(new, 6, HEAD_DIM, dtype=dtype, device=DEVICE)
    q_start = end - new
    out, lse = paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        table[kv_start // block_size :].contiguous(),
        q_start,
        kv_start,
        end - kv_start,
        block_size,
        HEAD_DIM**-0.5,
        window=window,
    )
    k_pos = torch.arange(kv_start, end, device=DEVICE)[None, :]
    q_pos = torch.arange(q_start, end, device=DEVICE)[:, None]
    mask = (k_pos <= q_pos) & ((q_pos - k_pos < window) if window else True)
    keys = gather(k_cache, table, end, block_size)[kv_start:]
    vals = gather(v_cache, table, end, block_size)[kv_start:]
    ref_out, ref_lse = reference(q, keys, vals, mask)
    torch.testing.assert_close(out.float(), ref_out, **tol(dtype))
    torch.testing.assert_close(lse, ref_lse, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 30])
def test_paged_prefill_batch_runs_every_sequence_of_a_step_in_one_launch(dtype, window):
    """Sequences of different lengths, cached prefixes and tables, each written into its own
    rows of the step's output; rows of no sequence (a decode token's) are left as they were."""
    block_size, heads, kv_heads = 16, 6, 2
    g = torch.Generator().manual_seed(3)
    k_cache, v_cache = make_cache(kv_heads, block_size, dtype)
    # (kv_start, cached, new): a fresh prompt, a fill into a fork, a short chunk
    specs = [(0, 0, 150), (32, 100, 40), (16, 5, 3)]
    tables, rows, first = [], [], 1  # row 0: a decode token's, not a prefill's
    width = max(-(-(a + c + n) // block_size) - a // block_size for a, c, n in specs)
    for kv_start, cached, new in specs:
        end = kv_start + cached + new
        table = random_table(-(-end // block_size), g)
        tables.append(table)
        rows.append((first, new, end - new, kv_start))
        first += new + 2  # gaps between the sequences' rows
    q = torch.randn(first, heads, HEAD_DIM, dtype=dtype, device=DEVICE)
    out = torch.full((first, heads, HEAD_DIM), 7.0, dtype=dtype, device=DEVICE)
    lse = torch.full((first, heads), 7.0, device=DEVICE)
    padded = torch.zeros(len(specs), width, dtype=torch.long, device=DEVICE)
    for i, (kv_start, _, _) in enumerate(specs):
        own = tables[i][kv_start // block_size :]
        padded[i, : own.numel()] = own
    seqs = torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    paged_prefill_batch(
        q,
        k_cache,
        v_cache,
        padded,
        seqs,
        max(n for _, _, n in specs),
        out,
        lse,
        block_size,
        HEAD_DIM**-0.5,
        window,
    )
    written = torch.zeros(first, dtype=torch.bool)
    for (row, new, q_start, kv_start), table in zip(rows, tables, strict=True):
        end = q_start + new
        k_pos = torch.arange(kv_start, end, device=DEVICE)[None, :]
        q_pos = torch.arange(q_start, end, device=DEVICE)[:, None]
        mask = (k_pos <= q_pos) & ((q_pos - k_pos < window) if window else True)
        keys = gather(k_cache, table, end, block_size)[kv_start:]
        vals = gather(v_cache, table, end, block_size)[kv_start:]
        ref_out, ref_lse = reference(q[row : row + new], keys, vals, mask)
        torch.testing.assert_close(out[row : row + new].float(), ref_out, **tol(dtype))
        torch.testing.assert_close(lse[row : row + new], ref_lse, **tol(dtype))
        written[row : row + new] = True
    assert (out[~written.to(DEVICE)] == 7.0).all() and (lse[~written.to(DEVICE)] == 7.0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [None, 50])
def test_shared_prefix_splits_fold_into_the_suffix_in_one_merge(dtype, num_splits, window):
    """The prefix's splits, left unreduced, merged straight into each token's suffix result
    equal attention over prefix + suffix (a window drops prefix keys, whole splits too)."""
    block_size, num_tokens, prefix_blocks = 16, 7, 9
    g = torch.Generator().manual_seed(num_splits)
    k_cache, v_cache = make_cache(2, block_size, dtype)
    prefix = random_table(prefix_blocks, g)
    q = torch.randn(num_tokens, 6, HEAD_DIM, dtype=dtype, device=DEVICE)
    prefix_len = prefix_blocks * block_size
    positions = torch.arange(prefix_len, prefix_len + num_tokens, device=DEVICE) + 30  # 30 own keys first
    part_out, part_lse = shared_prefix_attention(
        q,
        k_cache,
        v_cache,
        prefix,
        block_size,
        HEAD_DIM**-0.5,
        window=window,
        positions=positions if window else None,
        partial=True,
        num_splits=num_splits,
    )
    assert part_out.shape[2] == num_splits
    keys = gather(k_cache, prefix, prefix_len, block_size)
    vals = gather(v_cache, prefix, prefix_len, block_size)
    suffix_k = torch.randn(6, 2, HEAD_DIM, dtype=dtype, device=DEVICE)
    suffix_v = torch.randn(6, 2, HEAD_DIM, dtype=dtype, device=DEVICE)
    s_out, s_lse = reference(q, suffix_k, suffix_v)
    out, lse = s_out.clone().contiguous(), s_lse.clone().contiguous()
    merge_into(out, lse, torch.arange(num_tokens, device=DEVICE), part_out, part_lse)
    mask = None
    if window:
        visible = positions[:, None] - torch.arange(prefix_len, device=DEVICE)[None, :] < window
        mask = torch.cat([visible, torch.ones(num_tokens, 6, dtype=torch.bool, device=DEVICE)], 1)
    whole_out, whole_lse = reference(q, torch.cat([keys, suffix_k]), torch.cat([vals, suffix_v]), mask)
    torch.testing.assert_close(out, whole_out, **tol(dtype))
    torch.testing.assert_close(lse, whole_lse, **tol(dtype))


# -- bad inputs ---------------------------------------------------------------------------
def decode_args(**change):
    k_cache, v_cache = make_cache(2, 4, torch.float32)
    args = dict(
        q=torch.randn(2, 4, HEAD_DIM, device=DEVICE),
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=torch.tensor([[0, 1], [2, 3]], device=DEVICE),
        kv_lens=torch.tensor([5, 8], device=DEVICE),
        block_size=4,
        scale=0.25,
    )
    args.update(change)
    return args


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(q=torch.randn(2, 4, HEAD_DIM, dtype=torch.float64)), "q must be one of"),
        (dict(q=torch.randn(2, 3, HEAD_DIM)), "multiple of KV heads"),
        (dict(q=torch.randn(2, 4, 2 * HEAD_DIM)[..., ::2]), "contiguous in its last dimension"),
        (dict(block_table=torch.tensor([[0, 1], [2, 99]])), "outside 0..63"),
        (dict(block_table=torch.tensor([[0, 1], [2, -1]])), "outside 0..63"),
        (dict(block_table=torch.tensor([[0, 2], [1, 3]]).T), "block_table must be contiguous"),
        (dict(kv_lens=torch.tensor([5, 9])), "kv_lens exceeds"),
        (dict(kv_lens=torch.tensor([0, 3])), "at least one key"),
        (dict(block_size=3), "block_size must be a power of two"),
    ],
)
def test_decode_wrapper_rejects_bad_inputs(change, message):
    with pytest.raises(KernelInputError, match=message):
        paged_decode_attention(**decode_args(**change))


def test_other_wrappers_reject_bad_inputs():
    k_cache, v_cache = make_cache(2, 4, torch.float32)
    q = torch.randn(3, 4, HEAD_DIM)
    with pytest.raises(KernelInputError, match="must share one dtype"):
        store_kv(q[:, :2].half(), q[:, :2].half(), k_cache, v_cache, torch.tensor([0, 1, 2]))
    with pytest.raises(KernelInputError, match="past the end"):
        store_kv(q[:, :2], q[:, :2], k_cache, v_cache, torch.tensor([0, 1, 10_000]))
    with pytest.raises(KernelInputError, match="tail"):
        paged_prefill_attention(q, k_cache, v_cache, torch.tensor([0, 1]), 0, 0, 8, 4, 0.25)
    with pytest.raises(KernelInputError, match="non-empty"):
        shared_prefix_attention(q, k_cache, v_cache, torch.tensor([], dtype=torch.long), 4, 0.25)
    with pytest.raises(KernelInputError, match="rows point outside"):
        merge_into(
            torch.zeros(2, 4, HEAD_DIM),
            torch.zeros(2, 4),
            torch.tensor([5]),
            torch.zeros(1, 4, HEAD_DIM),
            torch.zeros(1, 4),
        )
