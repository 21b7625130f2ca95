"""Paged decode attention: one query token per sequence against its block table.

GQA aware: one program handles all query heads that share a KV head, so each key is loaded
once for the whole group. A program walks its keys in tiles of ``TILE_N`` keys that span
several cache blocks (each key's slot is looked up in the block table), multiplies in the
cache's dtype on the tensor cores with float32 accumulation, and keeps the softmax in base 2.
Long contexts are split across programs (flash-decoding): each split writes a partial result
with its log-sum-exp and a second kernel reduces the splits; a single split writes the result
directly. A sliding ``window`` keeps the keys less than ``window`` positions behind the query
(the tiles wholly before it are not read).

The number of splits depends on shapes only (sequences, table width, KV heads), so a step
with the same shapes launches the same kernels: what a CUDA graph replays.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parrot.engines.builtin.kernels.checks import (
    check,
    check_attention_inputs,
    check_block_table,
    check_tensor,
)
from parrot.engines.builtin.kernels.online_softmax import LOG2E, finish_base2, softmax_tile

TILE_N = 64  # keys per tile: four 16-key blocks, a multiple of the tensor cores' 16
MIN_KEYS_PER_SPLIT = 256  # a split shorter than this costs more to reduce than it saves
NUM_WARPS, NUM_STAGES = 4, 2  # on a GPU (benchmarks/gpu_kernels.py --sweep)


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    table_ptr,  # [num_seqs, max_blocks] first attended block first
    lens_ptr,  # [num_seqs] keys to attend, counted from the table's first block
    out_ptr,  # SINGLE: [num_seqs, num_heads, head_dim]; else [num_seqs, num_heads, splits, head_dim] f32
    lse_ptr,  # SINGLE: [num_seqs, num_heads] f32; else [num_seqs, num_heads, splits] f32
    qk_scale,  # scale * log2(e): scores in base 2
    window,  # > 0: attend only the last ``window`` keys
    keys_per_split,  # a multiple of TILE_N
    stride_qs,
    stride_qh,
    stride_cs,
    stride_ch,
    stride_ts,
    stride_os,
    stride_oh,
    stride_osp,
    stride_ls,
    stride_lh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TILE_N: tl.constexpr,
    EXACT: tl.constexpr,  # float32 cache: IEEE products, not TF32
    SINGLE: tl.constexpr,  # one split: write the final output in the output's dtype
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    first_visible = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    start = split * keys_per_split
    end = tl.minimum(start + keys_per_split, seq_len)
    start = tl.maximum(start, first_visible // TILE_N * TILE_N)
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    head_mask = g < GROUP
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :], mask=head_mask[:, None], other=0.0
    )  # [GROUP_PAD, HEAD_DIM] in the cache's dtype
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    n = tl.arange(0, TILE_N)
    table_row = table_ptr + seq * stride_ts
    for first in range(start, end, TILE_N):
        pos = first + n  # [TILE_N] key positions from the table's first block
        key_mask = (pos < end) & (pos >= first_visible)
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=pos < end, other=0).to(tl.int64)
        offsets = (
            (block * BLOCK_SIZE + pos % BLOCK_SIZE)[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
        )
        k = tl.load(k_cache_ptr + offsets, mask=key_mask[:, None], other=0.0)  # [TILE_N, HEAD_DIM]
        v = tl.load(v_cache_ptr + offsets, mask=key_mask[:, None], other=0.0)
        m_i, l_i, acc = softmax_tile(q, k, v, key_mask[None, :], m_i, l_i, acc, qk_scale, EXACT)
    out, lse = finish_base2(m_i, l_i, acc)
    if SINGLE:
        o_offsets = seq * stride_os + heads[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + o_offsets, out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
        tl.store(lse_ptr + seq * stride_ls + heads * stride_lh, lse, mask=head_mask)
    else:
        o_offsets = seq * stride_os + heads[:, None] * stride_oh + split * stride_osp + d[None, :]
        tl.store(out_ptr + o_offsets, out, mask=head_mask[:, None])
        tl.store(lse_ptr + seq * stride_ls + heads * stride_lh + split, lse, mask=head_mask)


@triton.jit
def _reduce_splits_kernel(
    part_out_ptr,  # [num_rows, num_heads, num_splits, head_dim] float32
    part_lse_ptr,  # [num_rows, num_heads, num_splits] float32
    out_ptr,  # [num_rows, num_heads, head_dim]
    lse_ptr,  # [num_rows, num_heads] float32, contiguous
    num_splits,
    stride_ps,
    stride_ph,
    stride_psp,
    stride_pls,
    stride_plh,
    stride_os,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    split_mask = sp < num_splits
    lse = tl.load(
        part_lse_ptr + seq * stride_pls + head * stride_plh + sp, mask=split_mask, other=float("-inf")
    )
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # every split empty (a window past them all)
    w = tl.where(split_mask, tl.exp(lse - m_safe), 0.0)  # [SPLITS_PAD]; empty splits weigh 0
    parts = tl.load(
        part_out_ptr + seq * stride_ps + head * stride_ph + sp[:, None] * stride_psp + d[None, :],
        mask=split_mask[:, None],
        other=0.0,
    )
    total = tl.sum(w, 0)
    out = tl.sum(parts * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + seq * NUM_HEADS + head, tl.where(total == 0.0, float("-inf"), m_safe + tl.log(total)))


def reduce_splits(
    part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> None:
    """``out`` [rows, heads, head_dim] and ``lse`` [rows, heads] (contiguous) from the splits'
    partial results ``part_out`` [rows, heads, splits, head_dim] and ``part_lse``."""
    rows, heads, splits, head_dim = part_out.shape
    _reduce_splits_kernel[(rows, heads)](
        part_out,
        part_lse,
        out,
        lse,
        splits,
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        NUM_HEADS=heads,
        SPLITS_PAD=triton.next_power_of_2(splits),
        HEAD_DIM=head_dim,
    )


def default_splits(device: torch.device, programs: int, max_keys: int) -> int:
    """Splits per sequence from shapes alone: enough programs for two waves of a GPU's
    multiprocessors, none shorter than ``MIN_KEYS_PER_SPLIT`` keys; one on the CPU."""
    if device.type != "cuda":
        return 1
    wanted = triton.cdiv(2 * torch.cuda.get_device_properties(device).multi_processor_count, max(1, programs))
    return max(1, min(wanted, max_keys // MIN_KEYS_PER_SPLIT))


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks * block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_table: torch.Tensor,  # [num_seqs, max_blocks] int32/int64
    kv_lens: torch.Tensor,  # [num_seqs] int: keys per sequence, from its table's first block
    block_size: int,
    scale: float,
    num_splits: int | None = None,
    window: int | None = None,  # a sliding window: keys less than this many positions back
    check_values: bool = True,  # False: skip the checks that read tensors (host syncs)
) -> tuple[torch.Tensor, torch.Tensor]:  # out [num_seqs, num_heads, head_dim], lse [num_seqs, num_heads]
    check(window is None or window >= 1, "a window must be positive")
    group, num_blocks = check_attention_inputs(q, k_cache, v_cache, block_size)
    num_seqs, num_heads, head_dim = q.shape
    check(
        block_table.dim() == 2 and block_table.shape[0] == num_seqs,
        "block_table must be [num_seqs, max_blocks]",
    )
    check_tensor("kv_lens", kv_lens, 1, (torch.int32, torch.int64), contiguous=True)
    check(kv_lens.shape[0] == num_seqs, "kv_lens needs one length per sequence")
    max_keys = block_table.shape[1] * block_size
    if check_values:
        check_block_table("block_table", block_table, num_blocks)
        if num_seqs:
            check(int(kv_lens.min()) >= 1, "every sequence must attend at least one key")
            check(int(kv_lens.max()) <= max_keys, "kv_lens exceeds what the block table covers")
    else:
        check_tensor("block_table", block_table, 2, (torch.int32, torch.int64), contiguous=True)
    out = torch.empty_like(q)
    lse = torch.empty(num_seqs, num_heads, dtype=torch.float32, device=q.device)
    if num_seqs == 0:
        return out, lse
    kv_heads = k_cache.shape[1]
    if num_splits is None:
        num_splits = default_splits(q.device, num_seqs * kv_heads, max_keys)
    check(num_splits >= 1, "num_splits must be positive")
    keys_per_split = triton.cdiv(triton.cdiv(max(max_keys, 1), num_splits), TILE_N) * TILE_N
    num_splits = triton.cdiv(max(max_keys, 1), keys_per_split)
    single = num_splits == 1
    if single:
        target_out, target_lse = out, lse
        o_strides = (out.stride(0), out.stride(1), 0)
    else:
        target_out = torch.empty(
            num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        target_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
        o_strides = (target_out.stride(0), target_out.stride(1), target_out.stride(2))
    _paged_decode_kernel[(num_seqs, kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_table,
        kv_lens,
        target_out,
        target_lse,
        scale * LOG2E,
        window or 0,
        keys_per_split,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        block_table.stride(0),
        *o_strides,
        target_lse.stride(0),
        target_lse.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        TILE_N=TILE_N,
        EXACT=k_cache.dtype == torch.float32,
        SINGLE=single,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    if not single:
        reduce_splits(target_out, target_lse, out, lse)
    return out, lse
