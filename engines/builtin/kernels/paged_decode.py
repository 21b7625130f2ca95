"""Paged decode attention: one query token per sequence against its block table.

GQA aware: one program handles all query heads that share a KV head, so each K/V block is
loaded once for the whole group. Long contexts are split across programs (split-KV); a
second kernel reduces the splits with their log-sum-exps. Returns output and log-sum-exp.
A sliding ``window`` keeps the keys less than ``window`` positions behind the query (the
blocks wholly before it are not read).
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
from parrot.engines.builtin.kernels.online_softmax import finish, online_softmax_step, tile_dot


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    table_ptr,  # [num_seqs, max_blocks] first attended block first
    lens_ptr,  # [num_seqs] keys to attend, counted from the table's first block
    part_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] float32
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] float32
    scale,
    window,  # > 0: attend only the last ``window`` keys
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
    EXACT: tl.constexpr,  # float32 cache: IEEE products, not TF32
    BLOCKS_PER_SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    first_visible = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    head_mask = g < GROUP
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :], mask=head_mask[:, None], other=0.0
    )
    q = q.to(tl.float32)  # [GROUP_PAD, HEAD_DIM]
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    t = tl.arange(0, BLOCK_SIZE)
    for i in range(BLOCKS_PER_SPLIT):
        block_index = split * BLOCKS_PER_SPLIT + i
        first_token = block_index * BLOCK_SIZE
        if (first_token < seq_len) & (first_token + BLOCK_SIZE > first_visible):
            block = tl.load(table_ptr + seq * stride_ts + block_index).to(tl.int64)
            token_mask = (first_token + t < seq_len) & (first_token + t >= first_visible)
            slots = block * BLOCK_SIZE + t
            offsets = slots[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
            k = tl.load(k_cache_ptr + offsets, mask=token_mask[:, None], other=0.0).to(tl.float32)
            v = tl.load(v_cache_ptr + offsets, mask=token_mask[:, None], other=0.0).to(tl.float32)
            s = tile_dot(q, tl.trans(k), HEAD_DIM, BLOCK_SIZE, EXACT) * scale  # [GROUP_PAD, BLOCK_SIZE]
            s = tl.where(token_mask[None, :], s, float("-inf"))
            m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, BLOCK_SIZE, HEAD_DIM, EXACT)
    out, lse = finish(m_i, l_i, acc)
    o_offsets = seq * stride_os + heads[:, None] * stride_oh + split * stride_osp + d[None, :]
    tl.store(part_out_ptr + o_offsets, out, mask=head_mask[:, None])
    tl.store(part_lse_ptr + seq * stride_ls + heads * stride_lh + split, lse, mask=head_mask)


@triton.jit
def _reduce_splits_kernel(
    part_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] float32
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] float32
    out_ptr,  # [num_seqs, num_heads, head_dim]
    lse_ptr,  # [num_seqs, num_heads] float32, contiguous
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
    w = tl.where(split_mask, tl.exp(lse - m), 0.0)  # [SPLITS_PAD]; empty splits weigh 0
    parts = tl.load(
        part_out_ptr + seq * stride_ps + head * stride_ph + sp[:, None] * stride_psp + d[None, :],
        mask=split_mask[:, None],
        other=0.0,
    )
    total = tl.sum(w, 0)
    out = tl.sum(parts * w[:, None], 0) / total
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + seq * NUM_HEADS + head, m + tl.log(total))


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
) -> tuple[torch.Tensor, torch.Tensor]:  # out [num_seqs, num_heads, head_dim], lse [num_seqs, num_heads]
    check(window is None or window >= 1, "a window must be positive")
    group, num_blocks = check_attention_inputs(q, k_cache, v_cache, block_size)
    num_seqs, num_heads, head_dim = q.shape
    check(
        block_table.dim() == 2 and block_table.shape[0] == num_seqs,
        "block_table must be [num_seqs, max_blocks]",
    )
    check_block_table("block_table", block_table, num_blocks)
    check_tensor("kv_lens", kv_lens, 1, (torch.int32, torch.int64), contiguous=True)
    check(kv_lens.shape[0] == num_seqs, "kv_lens needs one length per sequence")
    max_blocks = block_table.shape[1]
    if num_seqs:
        check(int(kv_lens.min()) >= 1, "every sequence must attend at least one key")
        check(int(kv_lens.max()) <= max_blocks * block_size, "kv_lens exceeds what the block table covers")
    if num_splits is None:
        # Enough programs to fill a GPU; one split per sequence when there is no GPU.
        num_splits = (
            1
            if not q.is_cuda
            else max(1, min(triton.cdiv(max_blocks, 8), 256 // max(1, num_seqs * k_cache.shape[1])))
        )
    check(num_splits >= 1, "num_splits must be positive")
    blocks_per_split = triton.cdiv(max(max_blocks, 1), num_splits)
    num_splits = triton.cdiv(max(max_blocks, 1), blocks_per_split)
    part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    lse = torch.empty(num_seqs, num_heads, dtype=torch.float32, device=q.device)
    if num_seqs == 0:
        return out, lse
    _paged_decode_kernel[(num_seqs, k_cache.shape[1], num_splits)](
        q,
        k_cache,
        v_cache,
        block_table,
        kv_lens,
        part_out,
        part_lse,
        scale,
        window or 0,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        block_table.stride(0),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        EXACT=k_cache.dtype == torch.float32,
        BLOCKS_PER_SPLIT=blocks_per_split,
    )
    _reduce_splits_kernel[(num_seqs, num_heads)](
        part_out,
        part_lse,
        out,
        lse,
        num_splits,
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
    )
    return out, lse
