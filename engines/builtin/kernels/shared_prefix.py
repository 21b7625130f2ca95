"""Shared-prefix attention: the queries of every sequence that shares one prefix attend it in
a single matrix-matrix pass (each key is loaded once per ``BLOCK_M`` query rows, instead of
once per sequence). The prefix is split across programs, as in flash-decoding, so a few
rows of queries still fill a GPU; each split leaves a partial result with its log-sum-exp.
``shared_prefix_attention`` returns them reduced, or (``partial=True``) as they are, for
:func:`~parrot.engines.builtin.kernels.merge.merge_into` to fold into each sequence's own
suffix attention in one pass. With a sliding ``window``, each query sees the prefix keys
less than ``window`` positions behind it (``positions`` of the queries, ``prefix_start`` of
the first key); a query past the whole prefix gets 0 and a log-sum-exp of -inf, which a
merge weighs at nothing."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parrot.engines.builtin.kernels.checks import check, check_attention_inputs, check_block_table
from parrot.engines.builtin.kernels.online_softmax import LOG2E, finish_base2, softmax_tile
from parrot.engines.builtin.kernels.paged_decode import reduce_splits

TILE_N = 64
MIN_KEYS_PER_SPLIT = 128


@triton.jit
def _shared_prefix_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim] all queries of the sharing sequences
    k_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_cache_ptr,
    blocks_ptr,  # [num_prefix_blocks] the shared (full) blocks
    pos_ptr,  # [num_tokens] query positions (read only with WINDOWED)
    out_ptr,  # [num_tokens, num_heads, splits, head_dim] float32
    lse_ptr,  # [num_tokens, num_heads, splits] float32
    num_rows,  # num_tokens * GROUP: one row per (token, query head of this KV head)
    prefix_len,  # keys in the prefix
    keys_per_split,  # a multiple of TILE_N
    qk_scale,  # scale * log2(e)
    prefix_start,  # position of the prefix's first key
    window,
    stride_qt,
    stride_qh,
    stride_cs,
    stride_ch,
    stride_ot,
    stride_oh,
    stride_osp,
    stride_lt,
    stride_lh,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TILE_N: tl.constexpr,
    EXACT: tl.constexpr,  # float32 cache: IEEE products, not TF32
    WINDOWED: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < num_rows
    token = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_mask[:, None],
        other=0.0,
    )  # [BLOCK_M, HEAD_DIM]
    if WINDOWED:
        q_pos = tl.load(pos_ptr + token, mask=row_mask, other=0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    n = tl.arange(0, TILE_N)
    start = split * keys_per_split
    end = tl.minimum(start + keys_per_split, prefix_len)
    for first in range(start, end, TILE_N):
        j = first + n  # [TILE_N] positions in the prefix
        in_range = j < end
        block = tl.load(blocks_ptr + j // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
        offsets = (
            (block * BLOCK_SIZE + j % BLOCK_SIZE)[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
        )
        k = tl.load(k_cache_ptr + offsets, mask=in_range[:, None], other=0.0)
        v = tl.load(v_cache_ptr + offsets, mask=in_range[:, None], other=0.0)
        allowed = in_range[None, :]
        if WINDOWED:
            allowed = allowed & (q_pos[:, None] - (prefix_start + j)[None, :] < window)
        m_i, l_i, acc = softmax_tile(q, k, v, allowed, m_i, l_i, acc, qk_scale, EXACT)
    out, lse = finish_base2(m_i, l_i, acc)
    tl.store(
        out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + split * stride_osp + d[None, :],
        out,
        mask=row_mask[:, None],
    )
    tl.store(lse_ptr + token * stride_lt + head * stride_lh + split, lse, mask=row_mask)


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
    partial: bool = False,  # True: the splits' results, [num_tokens, heads, splits, head_dim]
    num_splits: int | None = None,  # None: enough to fill a GPU (one on the CPU)
    check_values: bool = True,  # False: skip the checks that read tensors (host syncs)
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
    if check_values:
        check_block_table("prefix_blocks", prefix_blocks, num_blocks)
    prefix_len = prefix_blocks.numel() * block_size
    rows = num_tokens * group
    on_gpu = q.is_cuda
    block_m = 64 if on_gpu else 16
    row_tiles = triton.cdiv(max(rows, 1), block_m)
    splits = 1 if num_splits is None else num_splits
    if on_gpu and num_splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        wanted = triton.cdiv(2 * sms, row_tiles * k_cache.shape[1])
        splits = max(1, min(wanted, prefix_len // MIN_KEYS_PER_SPLIT))
    check(splits >= 1, "num_splits must be positive")
    keys_per_split = triton.cdiv(triton.cdiv(prefix_len, splits), TILE_N) * TILE_N
    splits = triton.cdiv(prefix_len, keys_per_split)
    part_out = torch.empty(num_tokens, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32, device=q.device)
    if num_tokens:
        _shared_prefix_kernel[(row_tiles, k_cache.shape[1], splits)](
            q,
            k_cache,
            v_cache,
            prefix_blocks,
            prefix_blocks if positions is None else positions.contiguous(),  # unread without a window
            part_out,
            part_lse,
            rows,
            prefix_len,
            keys_per_split,
            scale * LOG2E,
            prefix_start,
            window or 0,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            part_out.stride(0),
            part_out.stride(1),
            part_out.stride(2),
            part_lse.stride(0),
            part_lse.stride(1),
            GROUP=group,
            BLOCK_M=block_m,
            BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim,
            TILE_N=TILE_N,
            EXACT=k_cache.dtype == torch.float32,
            WINDOWED=window is not None,
            num_warps=4,
            num_stages=2,
        )
    if partial:
        return part_out, part_lse
    if splits == 1:
        return part_out[:, :, 0], part_lse[:, :, 0]
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=q.device)
    if num_tokens:
        reduce_splits(part_out, part_lse, out, lse)
    return out, lse
