"""Shared-prefix attention: the queries of every sequence that shares one prefix attend it in
a single matrix-matrix pass (each K/V block is loaded once for all of them, instead of once
per sequence). Returns the partial output and its log-sum-exp, to be merged with each
sequence's own suffix attention by :mod:`merge`. With a sliding ``window``, each query sees
the prefix keys less than ``window`` positions behind it (``positions`` of the queries,
``prefix_start`` of the first key); a query past the whole prefix gets 0 and a log-sum-exp
of -inf, which the merge weighs at nothing."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parrot.engines.builtin.kernels.checks import check, check_attention_inputs, check_block_table
from parrot.engines.builtin.kernels.online_softmax import finish, online_softmax_step, tile_dot


@triton.jit
def _shared_prefix_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim] all queries of the sharing sequences
    k_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_cache_ptr,
    blocks_ptr,  # [num_prefix_blocks] the shared (full) blocks
    pos_ptr,  # [num_tokens] query positions (read only with WINDOWED)
    out_ptr,  # [num_tokens, num_heads, head_dim] float32
    lse_ptr,  # [num_tokens, num_heads] float32
    num_rows,  # num_tokens * GROUP: one row per (token, query head of this KV head)
    num_prefix_blocks,
    scale,
    prefix_start,  # position of the prefix's first key
    window,
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
    WINDOWED: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < num_rows
    token = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_mask[:, None],
        other=0.0,
    ).to(tl.float32)  # [BLOCK_M, HEAD_DIM]
    if WINDOWED:
        q_pos = tl.load(pos_ptr + token, mask=row_mask, other=0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    t = tl.arange(0, BLOCK_SIZE)
    for j in range(0, num_prefix_blocks):
        block = tl.load(blocks_ptr + j).to(tl.int64)
        offsets = (block * BLOCK_SIZE + t)[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
        k = tl.load(k_cache_ptr + offsets).to(tl.float32)  # [BLOCK_SIZE, HEAD_DIM]
        v = tl.load(v_cache_ptr + offsets).to(tl.float32)
        # [BLOCK_M, BLOCK_SIZE]; the prefix is all visible, but for a window
        s = tile_dot(q, tl.trans(k), HEAD_DIM, BLOCK_SIZE, EXACT) * scale
        if WINDOWED:
            k_pos = prefix_start + j * BLOCK_SIZE + t
            s = tl.where(q_pos[:, None] - k_pos[None, :] < window, s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, BLOCK_SIZE, HEAD_DIM, EXACT)
    out, lse = finish(m_i, l_i, acc)
    tl.store(
        out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
        out,
        mask=row_mask[:, None],
    )
    tl.store(lse_ptr + token * stride_lt + head * stride_lh, lse, mask=row_mask)


def shared_prefix_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks * block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    prefix_blocks: torch.Tensor,  # [num_prefix_blocks] int, full blocks
    block_size: int,
    scale: float,
    window: int | None = None,  # a sliding window: keys less than this many positions back ...
    positions: torch.Tensor | None = None,  # [num_tokens] ... of these query positions
    prefix_start: int = 0,  # the position of the prefix's first key
) -> tuple[torch.Tensor, torch.Tensor]:  # out [num_tokens, heads, head_dim] f32, lse [num_tokens, heads] f32
    check(window is None or window >= 1, "a window must be positive")
    check(
        window is None or (positions is not None and positions.shape == q.shape[:1]),
        "a window needs the queries' positions",
    )
    group, num_blocks = check_attention_inputs(q, k_cache, v_cache, block_size)
    num_tokens, num_heads, head_dim = q.shape
    check(
        prefix_blocks.dim() == 1 and prefix_blocks.numel() >= 1,
        "prefix_blocks must be a non-empty [num_blocks]",
    )
    check_block_table("prefix_blocks", prefix_blocks, num_blocks)
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=q.device)
    if num_tokens == 0:
        return out, lse
    rows = num_tokens * group
    block_m = 16 if not q.is_cuda else 64
    _shared_prefix_kernel[(triton.cdiv(rows, block_m), k_cache.shape[1])](
        q,
        k_cache,
        v_cache,
        prefix_blocks,
        prefix_blocks if positions is None else positions.contiguous(),  # unread without a window
        out,
        lse,
        rows,
        prefix_blocks.numel(),
        scale,
        prefix_start,
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
        WINDOWED=window is not None,
    )
    return out, lse
