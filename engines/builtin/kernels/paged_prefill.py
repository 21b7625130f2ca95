"""Prefill attention over paged KV: many query tokens of one sequence, causal among the new
tokens and full over the cached prefix (what a Fill into a forked context needs), or within
a sliding ``window`` (keys less than ``window`` positions behind each query)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parrot.engines.builtin.kernels.checks import check, check_attention_inputs, check_block_table
from parrot.engines.builtin.kernels.online_softmax import finish, online_softmax_step, tile_dot


@triton.jit
def _paged_prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim] the sequence's new tokens
    k_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_cache_ptr,
    table_ptr,  # [num_table_blocks] first attended block first
    out_ptr,  # [num_tokens, num_heads, head_dim]
    lse_ptr,  # [num_tokens, num_heads] float32
    num_tokens,
    q_start,  # position of the first query token
    kv_start,  # position of the first key (the table's first block)
    kv_len,  # keys from kv_start
    scale,
    window,  # > 0: a query sees only the keys less than this many positions behind it
    stride_qt,
    stride_qh,
    stride_cs,
    stride_ch,
    stride_ot,
    stride_oh,
    stride_lt,
    stride_lh,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    EXACT: tl.constexpr,  # float32 cache: IEEE products, not TF32
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < num_tokens
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :], mask=row_mask[:, None], other=0.0
    )
    q = q.to(tl.float32)
    q_pos = q_start + rows  # [BLOCK_M]
    # Keys this tile can see: up to its last query's position (causal), within kv_len.
    last_pos = q_start + tl.minimum(tile * BLOCK_M + BLOCK_M, num_tokens) - 1
    visible = tl.minimum(kv_len, last_pos - kv_start + 1)
    num_blocks = tl.cdiv(visible, BLOCK_SIZE)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    t = tl.arange(0, BLOCK_SIZE)
    for j in range(0, num_blocks):
        block = tl.load(table_ptr + j).to(tl.int64)
        k_pos = kv_start + j * BLOCK_SIZE + t
        key_mask = k_pos < kv_start + kv_len
        offsets = (block * BLOCK_SIZE + t)[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
        k = tl.load(k_cache_ptr + offsets, mask=key_mask[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + offsets, mask=key_mask[:, None], other=0.0).to(tl.float32)
        s = tile_dot(q, tl.trans(k), HEAD_DIM, BLOCK_SIZE, EXACT) * scale  # [BLOCK_M, BLOCK_SIZE]
        allowed = key_mask[None, :] & (k_pos[None, :] <= q_pos[:, None])
        allowed = allowed & ((q_pos[:, None] - k_pos[None, :] < window) | (window <= 0))
        s = tl.where(allowed, s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, BLOCK_SIZE, HEAD_DIM, EXACT)
    out, lse = finish(m_i, l_i, acc)
    tl.store(
        out_ptr + rows[:, None] * stride_ot + head * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None],
    )
    tl.store(lse_ptr + rows * stride_lt + head * stride_lh, lse, mask=row_mask)


def paged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks * block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_table: torch.Tensor,  # [num_table_blocks] from the block holding position kv_start
    q_start: int,
    kv_start: int,
    kv_len: int,
    block_size: int,
    scale: float,
    window: int | None = None,  # a sliding window: keys less than this many positions back
) -> tuple[torch.Tensor, torch.Tensor]:  # out [num_tokens, num_heads, head_dim], lse [num_tokens, num_heads]
    check(window is None or window >= 1, "a window must be positive")
    group, num_blocks = check_attention_inputs(q, k_cache, v_cache, block_size)
    num_tokens, num_heads, head_dim = q.shape
    check(block_table.dim() == 1, "block_table must be one sequence's [num_blocks]")
    check_block_table("block_table", block_table, num_blocks)
    check(kv_start % block_size == 0, "kv_start must be block aligned")
    check(kv_len >= 1 and kv_len <= block_table.numel() * block_size, "kv_len does not fit the block table")
    check(
        q_start >= kv_start and q_start + num_tokens == kv_start + kv_len,
        "the new tokens must be the last kv_len keys' tail (q_start + num_tokens == kv_start + kv_len)",
    )
    out = torch.empty_like(q)
    lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=q.device)
    if num_tokens == 0:
        return out, lse
    block_m = 16 if not q.is_cuda else 64
    _paged_prefill_kernel[(triton.cdiv(num_tokens, block_m), num_heads)](
        q,
        k_cache,
        v_cache,
        block_table,
        out,
        lse,
        num_tokens,
        q_start,
        kv_start,
        kv_len,
        scale,
        window or 0,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        out.stride(0),
        out.stride(1),
        lse.stride(0),
        lse.stride(1),
        GROUP=group,
        BLOCK_M=block_m,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        EXACT=k_cache.dtype == torch.float32,
    )
    return out, lse
