"""Write new keys and values into their slots of the paged cache."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from parrot.engines.builtin.kernels.checks import FLOAT_TYPES, check, check_tensor


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    v_ptr,  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_slots, num_kv_heads, head_dim]
    slot_ptr,  # [num_tokens] int64; negative = skip
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,
    stride_ch,
    HEAD_DIM: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token)
    if slot >= 0:
        d = tl.arange(0, HEAD_DIM)
        k = tl.load(k_ptr + token * stride_kt + head * stride_kh + d)
        v = tl.load(v_ptr + token * stride_vt + head * stride_vh + d)
        tl.store(k_cache_ptr + slot * stride_cs + head * stride_ch + d, k)
        tl.store(v_cache_ptr + slot * stride_cs + head * stride_ch + d, v)


def store_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    check_values: bool = True,  # False: skip the check that reads ``slot_mapping`` (a host sync)
) -> None:
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, 3, FLOAT_TYPES)
    check(k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    check(
        k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride(), "k_cache and v_cache differ"
    )
    check(
        k.shape[1:] == k_cache.shape[1:],
        f"k heads/dim {tuple(k.shape[1:])} != cache {tuple(k_cache.shape[1:])}",
    )
    check(k.dtype == k_cache.dtype == v.dtype == v_cache.dtype, "k, v and the caches must share one dtype")
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64, torch.int32), contiguous=True)
    check(slot_mapping.shape[0] == k.shape[0], "slot_mapping needs one slot per token")
    if check_values and slot_mapping.numel():
        check(int(slot_mapping.max()) < k_cache.shape[0], "slot_mapping points past the end of the cache")
    head_dim = k.shape[2]
    check(head_dim & (head_dim - 1) == 0, f"head_dim must be a power of two, got {head_dim}")
    if k.shape[0] == 0:
        return
    _store_kv_kernel[(k.shape[0], k.shape[1])](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        HEAD_DIM=head_dim,
    )
