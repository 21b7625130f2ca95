"""Prefill attention over paged KV: many query tokens of one sequence, causal among the new
tokens and full over the cached prefix (what a Fill into a forked context needs), or within
a sliding ``window`` (keys less than ``window`` positions behind each query).

A program takes ``BLOCK_M`` queries of one head and walks their keys in tiles of ``TILE_N``
keys that span several cache blocks: first the tiles every query of the program sees whole
(no causal mask), then the tiles along the diagonal, masked; tiles past the last query are
not read. Products run in the cache's dtype on the tensor cores (see ``softmax_tile``).

``paged_prefill_batch`` runs every prefilling sequence of a step in one launch (a grid axis
per sequence, their positions read from a small table on the device): on an H200, eight
1k-token sequences launched one by one ran at 0.34-0.60x SDPA's batched call.
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

TILE_N = 64
BLOCK_M = 128  # queries per program on a GPU (16 on the CPU, 64 for short prefills)
NUM_WARPS, NUM_STAGES = 4, 3  # on a GPU, half precision: the best of gpu_kernels.py --sweep on an H200


@triton.jit
def _load_tile(
    k_cache_ptr, v_cache_ptr, table_ptr, j, kv_len, kv_head, stride_cs, stride_ch, d, BLOCK_SIZE: tl.constexpr
):
    """Keys and values [TILE_N, head_dim] at relative positions ``j`` (zeros past ``kv_len``)."""
    in_range = j < kv_len
    block = tl.load(table_ptr + j // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
    offsets = (block * BLOCK_SIZE + j % BLOCK_SIZE)[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
    k = tl.load(k_cache_ptr + offsets, mask=in_range[:, None], other=0.0)
    v = tl.load(v_cache_ptr + offsets, mask=in_range[:, None], other=0.0)
    return k, v


@triton.jit
def _paged_prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim] the new tokens (of every sequence, with SEQS)
    k_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_cache_ptr,
    table_ptr,  # [num_table_blocks], with SEQS [num_seqs, max_blocks]: first attended block first
    seqs_ptr,  # with SEQS: [num_seqs, 4] int32 rows (first token row, tokens, q_start, kv_start)
    out_ptr,  # [num_tokens, num_heads, head_dim]
    lse_ptr,  # [num_tokens, num_heads] float32
    num_tokens,  # without SEQS: the sequence's ...
    q_start,  # ... position of the first query token
    kv_start,  # ... position of the first key (the table's first block)
    stride_ts,  # with SEQS: the block table's row stride
    qk_scale,  # scale * log2(e)
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
    TILE_N: tl.constexpr,
    EXACT: tl.constexpr,  # float32 cache: IEEE products, not TF32
    SEQS: tl.constexpr,  # several sequences: program_id(2) picks one, seqs_ptr describes it
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    first_row = 0
    if SEQS:
        seq = tl.program_id(2)
        first_row = tl.load(seqs_ptr + seq * 4)
        num_tokens = tl.load(seqs_ptr + seq * 4 + 1)
        q_start = tl.load(seqs_ptr + seq * 4 + 2)
        kv_start = tl.load(seqs_ptr + seq * 4 + 3)
        table_ptr += seq * stride_ts
    # A sequence shorter than the longest leaves its last programs without queries.
    if tile * BLOCK_M < num_tokens:
        kv_len = q_start + num_tokens - kv_start
        kv_head = head // GROUP
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # within the sequence
        row_mask = rows < num_tokens
        step_rows = first_row + rows  # within the step's tokens
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(
            q_ptr + step_rows[:, None] * stride_qt + head * stride_qh + d[None, :],
            mask=row_mask[:, None],
            other=0.0,
        )  # [BLOCK_M, HEAD_DIM]
        q_rel = q_start - kv_start + rows  # [BLOCK_M] query positions relative to the first key
        first_rel = q_start - kv_start + tile * BLOCK_M  # the program's first query
        last_rel = q_start - kv_start + tl.minimum(tile * BLOCK_M + BLOCK_M, num_tokens) - 1
        hi = tl.minimum(kv_len, last_rel + 1)  # keys past the last query are never seen
        lo = tl.where(window > 0, tl.maximum(first_rel - window + 1, 0) // TILE_N * TILE_N, 0)
        # Tiles below ``whole`` are seen by every query of the program (causally and, without
        # a window, entirely).
        whole = tl.where(window > 0, lo, (first_rel + 1) // TILE_N * TILE_N)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        n = tl.arange(0, TILE_N)
        for first in range(lo, whole, TILE_N):
            j = first + n
            k, v = _load_tile(
                k_cache_ptr, v_cache_ptr, table_ptr, j, kv_len, kv_head, stride_cs, stride_ch, d, BLOCK_SIZE
            )
            m_i, l_i, acc = softmax_tile(q, k, v, (j < kv_len)[None, :], m_i, l_i, acc, qk_scale, EXACT)
        for first in range(whole, hi, TILE_N):
            j = first + n
            k, v = _load_tile(
                k_cache_ptr, v_cache_ptr, table_ptr, j, kv_len, kv_head, stride_cs, stride_ch, d, BLOCK_SIZE
            )
            allowed = (j[None, :] < kv_len) & (j[None, :] <= q_rel[:, None])
            allowed = allowed & ((q_rel[:, None] - j[None, :] < window) | (window <= 0))
            m_i, l_i, acc = softmax_tile(q, k, v, allowed, m_i, l_i, acc, qk_scale, EXACT)
        out, lse = finish_base2(m_i, l_i, acc)
        tl.store(
            out_ptr + step_rows[:, None] * stride_ot + head * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None],
        )
        tl.store(lse_ptr + step_rows * stride_lt + head * stride_lh, lse, mask=row_mask)


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
    check_values: bool = True,  # False: skip the checks that read tensors (host syncs)
) -> tuple[torch.Tensor, torch.Tensor]:  # out [num_tokens, num_heads, head_dim], lse [num_tokens, num_heads]
    check(window is None or window >= 1, "a window must be positive")
    group, num_blocks = check_attention_inputs(q, k_cache, v_cache, block_size)
    num_tokens, num_heads = q.shape[:2]
    check(block_table.dim() == 1, "block_table must be one sequence's [num_blocks]")
    if check_values:
        check_block_table("block_table", block_table, num_blocks)
    check(kv_start % block_size == 0, "kv_start must be block aligned")
    check(kv_len >= 1 and kv_len <= block_table.numel() * block_size, "kv_len does not fit the block table")
    check(
        q_start >= kv_start and q_start + num_tokens == kv_start + kv_len,
        "the new tokens must be the last kv_len keys' tail (q_start + num_tokens == kv_start + kv_len)",
    )
    out = torch.empty_like(q)
    lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=q.device)
    if num_tokens:
        _launch(
            q,
            k_cache,
            v_cache,
            block_table,
            None,
            out,
            lse,
            (num_tokens, q_start, kv_start),
            1,
            num_tokens,
            block_size,
            scale,
            window,
            group,
        )
    return out, lse


def paged_prefill_batch(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim] the step's tokens
    k_cache: torch.Tensor,  # [num_blocks * block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] each from the block holding its kv_start
    seqs: torch.Tensor,  # [num_seqs, 4] int32: first row in q, tokens, q_start, kv_start (aligned)
    max_tokens: int,  # the most tokens of one sequence
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim]: each sequence's rows written
    lse: torch.Tensor,  # [num_tokens, num_heads] float32: likewise
    block_size: int,
    scale: float,
    window: int | None = None,
) -> None:
    """Every prefilling sequence of a step in one launch, written into its rows of ``out``
    and ``lse``. The engine builds ``seqs`` and the tables itself: nothing here reads them
    on the host (no sync); the single-sequence wrapper above checks what it is given."""
    check(window is None or window >= 1, "a window must be positive")
    group, _ = check_attention_inputs(q, k_cache, v_cache, block_size)
    check_tensor("block_tables", block_tables, 2, (torch.int32, torch.int64), contiguous=True)
    check_tensor("seqs", seqs, 2, (torch.int32,), contiguous=True)
    check(seqs.shape == (block_tables.shape[0], 4), "seqs must be [num_seqs, 4], one row per table")
    check(out.shape == q.shape and lse.shape == q.shape[:2], "out and lse must cover q's rows")
    if seqs.shape[0] and max_tokens:
        _launch(
            q,
            k_cache,
            v_cache,
            block_tables,
            seqs,
            out,
            lse,
            (0, 0, 0),
            seqs.shape[0],
            max_tokens,
            block_size,
            scale,
            window,
            group,
        )


def _launch(
    q,
    k_cache,
    v_cache,
    tables,
    seqs,
    out,
    lse,
    one_seq,
    num_seqs,
    max_tokens,
    block_size,
    scale,
    window,
    group,
) -> None:
    num_heads, head_dim = q.shape[1], q.shape[2]
    on_gpu = q.is_cuda
    block_m = 16
    if on_gpu:
        # Smaller query tiles when the large ones would leave multiprocessors idle.
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        block_m = BLOCK_M if triton.cdiv(max_tokens, BLOCK_M) * num_heads * num_seqs >= sms else 64
    _paged_prefill_kernel[(triton.cdiv(max_tokens, block_m), num_heads, num_seqs)](
        q,
        k_cache,
        v_cache,
        tables,
        tables if seqs is None else seqs,  # unread for one sequence
        out,
        lse,
        *one_seq,
        tables.stride(0),
        scale * LOG2E,
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
        TILE_N=TILE_N,
        EXACT=k_cache.dtype == torch.float32,
        SEQS=seqs is not None,
        num_warps=NUM_WARPS if block_m == BLOCK_M else 4,
        num_stages=NUM_STAGES if on_gpu and k_cache.dtype != torch.float32 else 2,
    )
